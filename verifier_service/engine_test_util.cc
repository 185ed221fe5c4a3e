#include "verifier_service/engine_test_util.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/cpu_test_util.h"
#include "common/model/random_model.h"

namespace treespec::testing {

ModelConfig SmallConfig() {
  ModelConfig c = SmallLlamaConfig();
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

std::string WriteTempModel(const ModelConfig& config, uint64_t seed) {
  char pattern[] = "/tmp/treespec-model-XXXXXX";
  const char* dir = mkdtemp(pattern);
  if (dir == nullptr) return "";
  RandomModelOptions options;
  options.seed = seed;
  options.init_std = 0.1f;  // large enough that logits are far from uniform
  absl::Status status = WriteRandomModel(config, options, dir);
  return status.ok() ? std::string(dir) : "";
}

void RecordingSink::OnUpdate(GenerationUpdate update) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.insert(ids_.end(), update.token_ids.begin(), update.token_ids.end());
  done_ = done_ || update.finished;
  updates_.push_back(std::move(update));
  cv_.notify_all();
}

bool RecordingSink::Wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; });
}

std::vector<int32_t> RecordingSink::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ids_;
}

GenerationUpdate RecordingSink::final_update() const {
  std::lock_guard<std::mutex> lock(mu_);
  return updates_.empty() ? GenerationUpdate() : updates_.back();
}

int RecordingSink::updates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(updates_.size());
}

namespace {

// What a session opened with `params` takes from its drafter's prefix cache (as a drafter
// service answers DraftOpen.cached_tokens).
int ReusedRows(DraftSession& session, const DraftOpenParams& params) {
  return params.cached_tokens > 0
             ? session.ReuseCachedPrompt(params.prompt, params.cached_tokens, params.page_size)
             : 0;
}

// Holds the tree answering the latest commit until the engine takes it.
class MailboxDraftStream : public DraftStream {
 public:
  std::optional<DraftedTree> TakeTree(int64_t step) override {
    if (!tree_.has_value() || step_ != step) return std::nullopt;
    std::optional<DraftedTree> out = std::move(tree_);
    tree_.reset();
    return out;
  }
  int64_t TakeMisnumberedTrees() override { return 0; }
  bool broken() const override { return broken_; }

 protected:
  void Deliver(int64_t step, std::optional<DraftedTree> tree) {
    tree_ = std::move(tree);
    step_ = step;
  }
  bool broken_ = false;

 private:
  std::optional<DraftedTree> tree_;
  int64_t step_ = -1;
};

class LocalDraftStream final : public MailboxDraftStream {
 public:
  LocalDraftStream(std::unique_ptr<DraftSession> session, SpecLimits limits, int cached)
      : session_(std::move(session)), limits_(limits), cached_(cached) {}
  std::optional<int> opened_cached_tokens() const override { return cached_; }
  void Commit(int64_t step, DraftContext added, int tree_budget) override {
    if (tree_budget == kNoTree) {
      broken_ = broken_ || !session_->Append(added).ok();
      return;
    }
    absl::StatusOr<DraftedTree> tree =
        session_->Append(added).ok() ? session_->Draft(WithTreeBudget(limits_, tree_budget))
                                     : absl::StatusOr<DraftedTree>(absl::InternalError("append"));
    if (!tree.ok()) {
      broken_ = true;
      return;
    }
    Deliver(step, *std::move(tree));
  }

 private:
  std::unique_ptr<DraftSession> session_;
  SpecLimits limits_;
  int cached_;
};

class ScriptedDraftStream final : public MailboxDraftStream {
 public:
  explicit ScriptedDraftStream(ScriptedDraftSource::TreeFn fn) : fn_(std::move(fn)) {}
  void Commit(int64_t step, DraftContext, int tree_budget) override {
    if (tree_budget != kNoTree) Deliver(step, fn_(step));
  }

 private:
  ScriptedDraftSource::TreeFn fn_;
};

// Delivery threads share this with the stream; once the stream is gone they deliver nothing.
// Two locks, as GrpcDraftSource has: the engine calls TakeTree (which takes `mu`) while holding
// its own lock, and on_arrival takes the engine's lock, so on_arrival must never run under `mu`
// (that order inversion deadlocked SlowDrafterRecovers under load).
struct DelayedMailbox {
  std::mutex mu;  // guards tree and step
  std::optional<DraftedTree> tree;
  int64_t step = -1;
  std::mutex notify_mu;              // held while on_arrival runs, never together with mu
  bool detached = false;             // guarded by notify_mu
  std::function<void()> on_arrival;  // guarded by notify_mu
};

class DelayedDraftStream final : public DraftStream {
 public:
  DelayedDraftStream(std::unique_ptr<DraftSession> session, SpecLimits limits, int cached,
                     DelayedDraftSource::DelayFn delay, std::function<void()> on_arrival)
      : session_(std::move(session)),
        limits_(limits),
        cached_(cached),
        delay_(std::move(delay)),
        box_(std::make_shared<DelayedMailbox>()) {
    box_->on_arrival = std::move(on_arrival);
  }
  ~DelayedDraftStream() override {
    {
      std::lock_guard<std::mutex> lock(box_->notify_mu);
      box_->detached = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  void Commit(int64_t step, DraftContext added, int tree_budget) override {
    if (tree_budget == kNoTree) {
      session_->Append(added).IgnoreError();  // a failed append shows in later trees
      return;
    }
    absl::StatusOr<DraftedTree> tree = session_->Append(added).ok()
                                           ? session_->Draft(WithTreeBudget(limits_, tree_budget))
                                           : absl::StatusOr<DraftedTree>(DraftedTree());
    threads_.emplace_back([box = box_, step, delay = delay_(step), t = *std::move(tree)] {
      absl::SleepFor(delay);
      {
        std::lock_guard<std::mutex> lock(box->mu);
        box->tree = t;
        box->step = step;
      }
      std::lock_guard<std::mutex> lock(box->notify_mu);
      if (!box->detached) box->on_arrival();
    });
  }
  std::optional<DraftedTree> TakeTree(int64_t step) override {
    std::lock_guard<std::mutex> lock(box_->mu);
    if (!box_->tree.has_value() || box_->step != step) return std::nullopt;
    std::optional<DraftedTree> out = std::move(box_->tree);
    box_->tree.reset();
    return out;
  }
  int64_t TakeMisnumberedTrees() override { return 0; }
  bool broken() const override { return false; }
  std::optional<int> opened_cached_tokens() const override { return cached_; }

 private:
  std::unique_ptr<DraftSession> session_;
  SpecLimits limits_;
  int cached_;
  DelayedDraftSource::DelayFn delay_;
  std::shared_ptr<DelayedMailbox> box_;
  std::vector<std::thread> threads_;
};

// Drafts with `inner`, keeping everything its context is given in *log.
class RecordingSession final : public DraftSession {
 public:
  RecordingSession(std::unique_ptr<DraftSession> inner, DraftContext* log)
      : inner_(std::move(inner)), log_(log) {}
  absl::Status Append(const DraftContext& added) override {
    log_->tokens.insert(log_->tokens.end(), added.tokens.begin(), added.tokens.end());
    log_->features.Append(added.features);
    return inner_->Append(added);
  }
  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override {
    return inner_->Draft(limits);
  }
  int ReuseCachedPrompt(absl::Span<const int32_t> prompt, int offered, int page) override {
    return inner_->ReuseCachedPrompt(prompt, offered, page);
  }

 private:
  std::unique_ptr<DraftSession> inner_;
  DraftContext* log_;
};

}  // namespace

std::unique_ptr<DraftStream> StatedPoolSource::Open(const DraftOpenParams& params,
                                                    std::function<void()> on_arrival) {
  opened_.push_back(params);
  return local_.Open(params, std::move(on_arrival));
}

absl::StatusOr<std::unique_ptr<DraftSession>> RecordingFactory::NewSession() {
  absl::StatusOr<std::unique_ptr<DraftSession>> session = inner_->NewSession();
  if (!session.ok()) return session.status();
  log_ = DraftContext();
  return std::make_unique<RecordingSession>(*std::move(session), &log_);
}

std::unique_ptr<DraftStream> DelayedDraftSource::Open(const DraftOpenParams& params,
                                                      std::function<void()> on_arrival) {
  ++opened_;
  absl::StatusOr<std::unique_ptr<DraftSession>> session = factory_->NewSession();
  if (!session.ok()) return nullptr;
  const int cached = ReusedRows(**session, params);
  if (!(*session)->Append(TokenContext(params.prompt)).ok()) return nullptr;
  return std::make_unique<DelayedDraftStream>(*std::move(session), params.limits, cached, delay_,
                                              std::move(on_arrival));
}

std::unique_ptr<DraftStream> LocalDraftSource::Open(const DraftOpenParams& params,
                                                    std::function<void()>) {
  absl::StatusOr<std::unique_ptr<DraftSession>> session = factory_->NewSession();
  if (!session.ok()) return nullptr;
  const int cached = ReusedRows(**session, params);
  if (!(*session)->Append(TokenContext(params.prompt)).ok()) return nullptr;
  return std::make_unique<LocalDraftStream>(*std::move(session), params.limits, cached);
}

std::unique_ptr<DraftStream> ScriptedDraftSource::Open(const DraftOpenParams&,
                                                       std::function<void()>) {
  return std::make_unique<ScriptedDraftStream>(fn_);
}

GenerationUpdate RunToEnd(Engine& engine, GenerationRequest request) {
  auto failed = [](absl::Status status) {
    GenerationUpdate update;
    update.finished = true;
    update.status = std::move(status);
    return update;
  };
  auto sink = std::make_shared<RecordingSink>();
  if (absl::Status status = engine.Validate(request); !status.ok()) return failed(status);
  absl::StatusOr<uint64_t> handle = engine.Submit(std::move(request), sink);
  if (!handle.ok()) return failed(handle.status());
  if (!sink->Wait()) return failed(absl::DeadlineExceededError("request did not finish in time"));
  GenerationUpdate last = sink->final_update();
  last.token_ids = sink->ids();
  return last;
}

}  // namespace treespec::testing
