#include "drafter_service/drafter_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/rpc/draft_context_proto.h"
#include "common/rpc/drafter_kind_proto.h"
#include "common/rpc/spec_limits_proto.h"
#include "common/rpc/status_conversion.h"
#include "common/tokenizer/utf8.h"
#include "common/tree/token_tree.h"
#include "common/util/log.h"

namespace treespec {
namespace {

// Token ids must be in [0, vocab_size); vocab_size 0 = unknown, only >= 0 is checked.
absl::Status CheckTokens(const google::protobuf::RepeatedField<int32_t>& tokens, int vocab_size,
                         const std::string& what) {
  const int64_t limit = vocab_size > 0 ? vocab_size : std::numeric_limits<int32_t>::max();
  for (int i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " token id ", tokens[i], " at index ", i, " out of range [0, ",
                       vocab_size > 0 ? absl::StrCat(vocab_size) : std::string("2^31"), ")"));
    }
  }
  return absl::OkStatus();
}

// Host name and a number drawn now: a restarted drafter on the same host is a new drafter.
std::string NewDrafterId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "drafter");
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) | random();
  return absl::StrCat(host, "-", absl::Hex(nonce, absl::kZeroPad16));
}

v1::DrafterInfo MakeInfo(const DrafterServiceOptions& options, const DrafterRegistry& drafters) {
  v1::DrafterInfo info;
  info.set_drafter_id(NewDrafterId());
  ToProto(options.spec.defaults, info.mutable_defaults());
  ToProto(options.spec.max, info.mutable_max());
  for (DrafterKind kind : drafters.kinds()) {
    info.add_modes(ToProto(kind));
    if (const FeatureSpec needs = drafters.Find(kind)->features(); !needs.empty()) {
      ToProto(kind, needs, info.add_feature_needs());
    }
  }
  info.set_default_mode(ToProto(options.default_kind));
  return info;
}

}  // namespace

absl::Status ValidateDrafterServiceOptions(const DrafterServiceOptions& options,
                                           const DrafterRegistry& drafters) {
  const std::vector<DrafterKind> served = drafters.kinds();
  if (served.empty()) return absl::InvalidArgumentError("no drafter kind to serve");
  if (drafters.Find(options.default_kind) == nullptr) {
    const DrafterKindInfo& kind = InfoOf(options.default_kind);
    return absl::InvalidArgumentError(
        absl::StrCat("--default_mode=", kind.name, " needs ", kind.needs,
                     "; or use one of the kinds served: ", DrafterKindNames(served)));
  }
  if (absl::Status s = ValidateSpecBounds(options.spec); !s.ok()) return s;
  if (options.vocab_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_size must be >= 0, got ", options.vocab_size));
  }
  if (options.worker_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 1, got ", options.worker_threads));
  }
  if (options.session_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--session_idle_timeout_s must be >= 0, got ",
                     absl::ToDoubleSeconds(options.session_idle_timeout)));
  }
  return absl::OkStatus();
}

// One Draft stream. Messages are read and validated on gRPC's callback threads; the work
// (opening the session, appending, drafting) runs on the service's WorkerPool, one task at a
// time per session. All stream operations (StartRead/StartWrite/Finish) are issued under mu_:
// gRPC never runs a reaction inline from them, and OnDone takes mu_ before deleting, so no
// thread can touch the reactor after it is gone.
class DrafterService::SessionReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit SessionReactor(DrafterService* service) : service_(service) {
    const int active = ++service_->active_sessions_;
    serial_ = ++service_->total_sessions_;
    if (service_->metrics_ != nullptr) service_->metrics_->OnSessionOpened();
    request_id_ = absl::StrCat("#", serial_);  // until the open names it
    TS_LOG(kDebug, "draft stream #%d opened (%d active)", serial_, active);
    {
      std::lock_guard<std::mutex> lock(service_->sessions_mu_);
      service_->sessions_.insert(this);
    }
    std::lock_guard<std::mutex> lock(mu_);
    last_heard_ = absl::Now();
    StartRead(&read_buffer_);
  }

  // Reaper thread, under the service's sessions_mu_: ends the session if its verifier has been
  // silent for `timeout` while nothing of ours was pending (a tree being drafted is our delay,
  // not the verifier's).
  void EndIfIdle(absl::Time now, absl::Duration timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || failed_ || cancelled_ || scheduled_ || now - last_heard_ < timeout) return;
    if (service_->metrics_ != nullptr) service_->metrics_->OnSessionReaped();
    TS_LOG(kInfo, "draft session %s: nothing from its verifier for %s; ending it", request_id_,
           absl::FormatDuration(now - last_heard_));
    FailLocked(absl::DeadlineExceededError(
        absl::StrCat("draft session idle for ", absl::FormatDuration(now - last_heard_),
                     " (the drafter's --session_idle_timeout_s is ", absl::ToDoubleSeconds(timeout),
                     "); open a new session")));
    AdvanceLocked();
  }

  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      read_closed_ = true;  // half-close (or the call is over)
    } else if (!failed_ && !cancelled_) {
      last_heard_ = absl::Now();
      ++messages_read_;
      absl::Status status = ParseLocked();
      if (status.ok()) status = AcceptLocked();
      if (status.ok()) {
        StartRead(&read_buffer_);
      } else {
        read_closed_ = true;
        FailLocked(std::move(status));
      }
    }
    AdvanceLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) write_failed_ = true;  // the stream is gone; nothing more can be sent
    AdvanceLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    queue_.clear();
    AdvanceLocked();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);  // waits for whoever issued Finish
    }
    {
      std::lock_guard<std::mutex> lock(service_->sessions_mu_);  // and for the reaper
      service_->sessions_.erase(this);
    }
    if (session_ != nullptr) {
      // Freeing a model session waits for the model lock: do it off the callback thread.
      std::shared_ptr<DraftSession> session(std::move(session_));
      service_->pool_.Submit([session] {});
    }
    const int active = --service_->active_sessions_;
    if (service_->metrics_ != nullptr) service_->metrics_->OnSessionClosed();
    const int drafted = steps_ - stale_steps_ - skipped_steps_;
    TS_LOG(kInfo,
           "draft session %s done: mode=%s steps=%d drafted_nodes=%d stale_steps=%d "
           "no_tree_steps=%d mean_draft_ms=%.3f status=%s active_sessions=%d",
           request_id_, DrafterKindName(kind_), steps_, drafted_nodes_, stale_steps_,
           skipped_steps_, drafted > 0 ? draft_ms_ / drafted : 0.0,
           cancelled_ ? "CANCELLED" : error_.ToString(), active);
    delete this;
  }

 private:
  struct Work {
    bool open = false;
    int64_t step = 0;
    DraftContext added;    // the prompt for open, the commit's tokens and features
    int tree_budget = 0;   // the commit's (0: the session's)
    bool no_tree = false;  // append only, answer nothing
    // Open: the verifier's cached prompt tokens (DraftOpen.cached_tokens) and KV page.
    int offered_cached = 0;
    int page_size = 0;
  };

  // The message just read, into request_.
  absl::Status ParseLocked() {
    request_.Clear();
    const grpc::Status parsed =
        grpc::SerializationTraits<v1::DraftRequest>::Deserialize(&read_buffer_, &request_);
    if (parsed.ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("message ", messages_read_,
                                                   " of the Draft stream is not a DraftRequest (",
                                                   parsed.error_message(), "); the session ends"));
  }

  // Validates request_ and queues its work.
  absl::Status AcceptLocked() {
    switch (request_.kind_case()) {
      case v1::DraftRequest::kOpen:
        if (opened_) {
          return absl::InvalidArgumentError(
              "open sent twice: a Draft stream carries exactly one session");
        }
        return AcceptOpenLocked(request_.open());
      case v1::DraftRequest::kCommit: {
        if (!opened_) return absl::InvalidArgumentError("first message must be open");
        const v1::DraftCommit& commit = request_.commit();
        if (commit.more()) return AcceptCommitPartLocked(commit);
        if (commit.tokens().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("commit step ", commit.step(),
                           " carries no tokens; it must end with the pending bonus token"));
        }
        const std::string what = absl::StrCat("commit step ", commit.step());
        absl::Status status =
            CheckTokens(commit.tokens(), service_->options_.vocab_size, what + ":");
        if (!status.ok()) return status;
        if (commit.tree_budget() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": tree_budget is ",
                                                         commit.tree_budget(),
                                                         "; it must be >= 0 (0 = the "
                                                         "session's)"));
        }
        absl::StatusOr<DraftContext> added = DraftContextFromProto(commit, what);
        if (!added.ok()) return added.status();
        if (!parts_.empty()) {  // the rows of its earlier parts come first
          if (parts_step_ != commit.step()) return PartStepMismatch(commit.step());
          parts_.Append(added->features);
          added->features = std::exchange(parts_, TargetFeatures());
        }
        if (status = CheckFeatureRowsLocked(*added, what); !status.ok()) return status;
        added->features = SelectLayers(std::move(added->features), sent_layers_,
                                       feature_spec_.layers, feature_spec_.hidden);
        queue_.push_back(
            Work{false, commit.step(), *std::move(added), commit.tree_budget(), commit.no_tree()});
        return absl::OkStatus();
      }
      case v1::DraftRequest::KIND_NOT_SET:
        break;
    }
    if (!opened_) return absl::InvalidArgumentError("first message must be open");
    return absl::InvalidArgumentError("request carries neither open nor commit");
  }

  // A part of a commit that carries feature rows only (DraftCommit.more): kept until the
  // commit's last part, which is checked with them.
  absl::Status AcceptCommitPartLocked(const v1::DraftCommit& part) {
    const std::string what = absl::StrCat("commit step ", part.step(), " (a part with `more`)");
    if (!part.tokens().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " carries ", part.tokens_size(),
          " tokens; a part with `more` carries feature rows only, the commit's last part the "
          "tokens"));
    }
    if (!parts_.empty() && parts_step_ != part.step()) return PartStepMismatch(part.step());
    absl::StatusOr<DraftContext> rows = DraftContextFromProto(part, what);
    if (!rows.ok()) return rows.status();
    const TargetFeatures& f = rows->features;
    if (absl::Status s = CheckFeatureWidthLocked(f, what); !s.ok()) return s;
    // Held rows stay bounded by the context: before the tokens come, a session can hold at
    // most a row per context token (the last part's tokens add the rest).
    if (feature_rows_ + parts_.rows + f.rows > context_tokens_) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", feature_rows_ + parts_.rows + f.rows,
                       " feature rows before the commit's tokens, for a context of ",
                       context_tokens_, " tokens; send at most one row per context token"));
    }
    parts_step_ = part.step();
    parts_.Append(f);
    return absl::OkStatus();
  }

  absl::Status PartStepMismatch(int64_t step) const {
    return absl::InvalidArgumentError(
        absl::StrCat("commit step ", step, " follows parts of commit step ", parts_step_,
                     "; a commit's parts are sent together, its last part without `more`"));
  }

  absl::Status AcceptOpenLocked(const v1::DraftOpen& open) {
    const DrafterServiceOptions& options = service_->options_;
    const std::string& id = open.request_id();
    if (id.size() > kMaxDraftRequestIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("open.request_id has ", id.size(),
                                                     " bytes; at most ", kMaxDraftRequestIdBytes,
                                                     " are allowed"));
    }
    if (const size_t at = utf8::FindInvalid(id); at != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("open.request_id is not valid UTF-8 (byte ", at, ")"));
    }
    if (!id.empty()) request_id_ = id;
    if (open.mode() == v1::SPECULATION_MODE_OFF) {
      return absl::InvalidArgumentError(
          "mode OFF drafts nothing: verify without a drafter session instead of opening one");
    }
    if (open.mode() == v1::SPECULATION_MODE_AUTO) {
      kind_ = options.default_kind;
    } else if (const std::optional<DrafterKind> kind = DrafterKindFromProto(open.mode())) {
      kind_ = *kind;
    } else {  // proto3 enums are open: the wire may carry values we do not know
      return absl::InvalidArgumentError(
          absl::StrCat("unknown speculation mode ", static_cast<int>(open.mode()),
                       "; use AUTO or one of the kinds served: ",
                       DrafterModeNames(service_->drafters_.kinds())));
    }
    factory_ = service_->drafters_.Find(kind_);
    if (factory_ == nullptr) {
      const DrafterKindInfo& kind = InfoOf(kind_);
      return absl::FailedPreconditionError(
          absl::StrCat("mode ", kind.mode_name, " is not served by this drafter (it serves ",
                       DrafterModeNames(service_->drafters_.kinds()),
                       "); use one of those, or a drafter with ", kind.needs));
    }
    feature_spec_ = factory_->features();
    sent_layers_.assign(open.feature_layers().begin(), open.feature_layers().end());
    if (absl::Status status = CheckFeatureLayersLocked(); !status.ok()) return status;
    const SpecLimits asked{open.tree_budget(), open.max_depth(), open.top_k()};
    if (asked.tree_budget < 0 || asked.max_depth < 0 || asked.top_k < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "open: limits must be >= 0 (0 = the drafter's default); got ", SpecLimitsString(asked)));
    }
    // More than this drafter serves runs at its maxima, and DraftOpened says so: the verifier
    // chose the request's limits from its whole pool, and a session on a smaller drafter still
    // speculates rather than failing.
    absl::StatusOr<SpecLimits> limits =
        ResolveSpecLimits(ClampSpecLimits(asked, options.spec.max), options.spec, "open.");
    if (!limits.ok()) return limits.status();
    limits_ = *limits;
    absl::Status status = CheckTokens(open.prompt_ids(), options.vocab_size, "prompt");
    if (!status.ok()) return status;
    const int offered = open.cached_tokens(), page = open.page_size();
    if (offered < 0 || offered > open.prompt_ids().size() || page < 0 ||
        (offered > 0 && (page == 0 || offered % page != 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("open.cached_tokens ", offered, " must be a multiple of open.page_size ",
                       page, " within the prompt's ", open.prompt_ids().size(), " tokens"));
    }
    opened_ = true;
    context_tokens_ = open.prompt_ids().size();
    Work work{true, 0, {{open.prompt_ids().begin(), open.prompt_ids().end()}, {}}};
    work.offered_cached = feature_spec_.empty() ? 0 : offered;
    work.page_size = page;
    // DraftOpened follows from the worker, once the session knows which rows it holds.
    queue_.push_back(std::move(work));
    return absl::OkStatus();
  }

  // The layers the verifier will send (open.feature_layers) must hold those this kind reads;
  // a kind that reads tokens only gets none.
  absl::Status CheckFeatureLayersLocked() const {
    const FeatureSpec& spec = feature_spec_;
    const std::string sent = absl::StrCat("[", absl::StrJoin(sent_layers_, ", "), "]");
    if (spec.empty()) {
      if (sent_layers_.empty()) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("open.feature_layers is ", sent, " but a ",
                                                     InfoOf(kind_).mode_name,
                                                     " session reads tokens only; send none"));
    }
    if (!LayersAscendingWithin(sent_layers_, spec.num_layers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("open.feature_layers ", sent, " must be strictly ascending within [0, ",
                       spec.num_layers, ") (the layers of the target this drafter serves)"));
    }
    if (!LayersInclude(sent_layers_, spec.layers)) {
      return absl::FailedPreconditionError(
          absl::StrCat("open.feature_layers ", sent, " lack layers this ", InfoOf(kind_).mode_name,
                       " drafter reads: it needs ", FeatureSpecString(spec),
                       " (DrafterInfo.feature_needs); capture those on the verifier"));
    }
    return absl::OkStatus();
  }

  // Rows as wide as open.feature_layers; none for a session that reads tokens only.
  absl::Status CheckFeatureWidthLocked(const TargetFeatures& f, const std::string& what) const {
    const FeatureSpec& spec = feature_spec_;
    if (spec.empty()) {
      if (f.empty()) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": features: a ", InfoOf(kind_).mode_name,
                       " session reads tokens only; send no features (feature_rows 0)"));
    }
    const int sent_width = static_cast<int>(sent_layers_.size()) * spec.hidden;
    if (!f.empty() && f.width != sent_width) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": features rows are ", f.width, " values wide; open.feature_layers [",
          absl::StrJoin(sent_layers_, ", "), "] x hidden ", spec.hidden, " = ", sent_width));
    }
    return absl::OkStatus();
  }

  // A session that takes features must hold a row for every context token but the pending
  // bonus after each commit (common/tree/draft_context.h), each as wide as its kind needs; one
  // that takes none gets none.
  absl::Status CheckFeatureRowsLocked(const DraftContext& added, const std::string& what) {
    const FeatureSpec& spec = feature_spec_;
    const TargetFeatures& f = added.features;
    context_tokens_ += static_cast<int64_t>(added.tokens.size());
    if (absl::Status s = CheckFeatureWidthLocked(f, what); !s.ok()) return s;
    if (spec.empty()) return absl::OkStatus();
    feature_rows_ += f.rows;
    if (feature_rows_ != context_tokens_ - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": features: the session has ", feature_rows_, " feature rows for ",
                       context_tokens_, " context tokens; a ", InfoOf(kind_).mode_name,
                       " session needs one per token but the last (the pending bonus)"));
    }
    return absl::OkStatus();
  }

  void FailLocked(absl::Status status) {
    if (!failed_) {
      failed_ = true;
      error_ = std::move(status);
      TS_LOG(kDebug, "draft session %s failing: %s", request_id_, error_.ToString());
    }
    queue_.clear();
    writes_.clear();
  }

  // Starts whatever can start now: the next write, the next task, or Finish.
  void AdvanceLocked() {
    if (finished_) return;
    const bool dead = failed_ || cancelled_ || write_failed_;
    if (!writing_ && !writes_.empty() && !dead) {
      bool own_buffer = false;
      current_write_.Clear();
      const grpc::Status serialized = grpc::SerializationTraits<v1::DraftResponse>::Serialize(
          writes_.front(), &current_write_, &own_buffer);
      writes_.pop_front();
      if (!serialized.ok()) {
        FailLocked(absl::InternalError(
            absl::StrCat("could not serialize a DraftResponse: ", serialized.error_message())));
        AdvanceLocked();
        return;
      }
      writing_ = true;
      StartWrite(&current_write_);
    }
    if (!scheduled_ && !queue_.empty() && !dead) {
      scheduled_ = true;
      if (service_->metrics_ != nullptr) service_->metrics_->OnTreeQueued();
      service_->pool_.Submit([this, queued = std::chrono::steady_clock::now()] { RunOne(queued); });
    }
    if (scheduled_ || writing_) return;
    if (dead) {
      finished_ = true;
      Finish(failed_ ? ToGrpcStatus(error_)
                     : grpc::Status(grpc::StatusCode::CANCELLED, "draft stream cancelled"));
    } else if (read_closed_ && queue_.empty() && writes_.empty()) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  // One queued task, on the worker pool. session_ is only touched here (serially) and in
  // OnDone (after the last task).
  void RunOne(std::chrono::steady_clock::time_point queued) {
    if (service_->metrics_ != nullptr) {
      service_->metrics_->OnTreeDequeued(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - queued).count());
    }
    Work work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty() || failed_ || cancelled_) {
        scheduled_ = false;
        AdvanceLocked();
        return;
      }
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status;
    v1::DraftResponse response;
    bool respond = false;
    if (work.open) {
      absl::StatusOr<std::unique_ptr<DraftSession>> session = factory_->NewSession();
      if (session.ok()) {
        session_ = *std::move(session);
        const int reused = work.offered_cached > 0
                               ? session_->ReuseCachedPrompt(work.added.tokens, work.offered_cached,
                                                             work.page_size)
                               : 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          // Commit 0 brings the rows after them (a verifier that offered rows sends it only
          // after this answer; one that offered none may have sent it already).
          feature_rows_ += reused;
          v1::DraftResponse opened;
          ToProto(limits_, opened.mutable_opened()->mutable_limits());
          *opened.mutable_opened()->mutable_drafter() = service_->info_;
          opened.mutable_opened()->set_cached_tokens(reused);
          writes_.push_back(std::move(opened));
          AdvanceLocked();
        }
        if (work.offered_cached > 0 && service_->metrics_ != nullptr) {
          service_->metrics_->OnPrefixLookup(kind_, work.offered_cached, reused);
        }
        status = session_->Append(work.added);
        const std::optional<int> cached = session_->cached_prompt_tokens();
        if (status.ok() && cached.has_value() && service_->metrics_ != nullptr) {
          service_->metrics_->OnPrefixLookup(kind_, static_cast<int>(work.added.tokens.size()),
                                             *cached);
        }
      } else {
        status = session.status();
      }
    } else if (work.no_tree) {
      ++steps_;
      ++skipped_steps_;
      status = session_->Append(work.added);
    } else {
      respond = true;
      response.mutable_tree()->set_step(work.step);
      status = AppendAndDraftInto(work.added, work.step, work.tree_budget, response.mutable_tree());
    }
    std::lock_guard<std::mutex> lock(mu_);
    scheduled_ = false;
    if (!status.ok()) {
      FailLocked(std::move(status));
    } else if (respond) {
      writes_.push_back(std::move(response));
    }
    AdvanceLocked();
  }

  // Appends the commit's tokens and drafts the tree answering commit `step` (one call, so a
  // batching drafter runs both as one job), unless a newer commit is already queued: the
  // verifier ignores stale trees, so that step only appends and gets an empty tree. A commit's
  // `tree_budget` (0: none) lowers the session's for that tree (and the children per node).
  absl::Status AppendAndDraftInto(const DraftContext& added, int64_t step, int tree_budget,
                                  v1::DraftTree* out) {
    ++steps_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) {
        ++stale_steps_;
        if (service_->metrics_ != nullptr) service_->metrics_->OnStaleStep();
        return session_->Append(added);
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const SpecLimits limits = WithTreeBudget(limits_, tree_budget);
    absl::StatusOr<DraftedTree> tree = session_->AppendAndDraft(added, limits);
    if (!tree.ok()) return tree.status();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    draft_ms_ += ms;
    const int vocab = service_->options_.vocab_size > 0 ? service_->options_.vocab_size
                                                        : std::numeric_limits<int32_t>::max();
    absl::Status valid = ValidateDraftedTree(*tree, vocab, limits.tree_budget, limits.max_depth);
    if (!valid.ok()) {
      return absl::InternalError(absl::StrCat("drafter produced a bad tree: ", valid.message()));
    }
    drafted_nodes_ += static_cast<int>(tree->tokens.size());
    if (service_->metrics_ != nullptr) {
      service_->metrics_->OnTreeBuilt(ms / 1e3, static_cast<int>(tree->tokens.size()));
    }
    out->mutable_tokens()->Assign(tree->tokens.begin(), tree->tokens.end());
    out->mutable_parents()->Assign(tree->parents.begin(), tree->parents.end());
    out->mutable_logprobs()->Assign(tree->logprobs.begin(), tree->logprobs.end());
    TS_LOG(kDebug, "draft session %s step %d: %d nodes in %.3f ms", request_id_, step,
           static_cast<int>(tree->tokens.size()), ms);
    return absl::OkStatus();
  }

  DrafterService* const service_;
  int64_t serial_ = 0;

  std::mutex mu_;
  grpc::ByteBuffer read_buffer_;  // target of the outstanding read
  int64_t messages_read_ = 0;
  v1::DraftRequest request_;        // the message read last, parsed
  grpc::ByteBuffer current_write_;  // the outstanding write, serialized
  std::deque<v1::DraftResponse> writes_;
  std::deque<Work> queue_;
  bool opened_ = false;
  bool scheduled_ = false;  // a RunOne is queued or running
  bool writing_ = false;
  bool read_closed_ = false;
  bool write_failed_ = false;
  bool cancelled_ = false;
  bool failed_ = false;
  bool finished_ = false;  // Finish was called
  absl::Status error_;
  absl::Time last_heard_;       // the verifier's latest message (or the stream's start)
  int64_t context_tokens_ = 0;  // prompt and committed tokens accepted so far
  int64_t feature_rows_ = 0;    // target feature rows accepted so far

  // Set by the open (under mu_) before the first task; read by tasks afterwards.
  std::string request_id_;
  DrafterKind kind_ = DrafterKind::kNgram;
  DrafterFactory* factory_ = nullptr;
  FeatureSpec feature_spec_;      // the features its sessions take (factory_->features())
  std::vector<int> sent_layers_;  // the layers the commits' rows carry (open.feature_layers)
  TargetFeatures parts_;          // rows of a commit's parts with `more` so far
  int64_t parts_step_ = 0;        // their commit's step
  SpecLimits limits_;

  // Touched only by the serial tasks (and OnDone after them).
  std::unique_ptr<DraftSession> session_;
  int steps_ = 0;
  int stale_steps_ = 0;
  int skipped_steps_ = 0;  // commits that asked for no tree
  int drafted_nodes_ = 0;
  double draft_ms_ = 0.0;
};

DrafterService::DrafterService(const DrafterServiceOptions& options, DrafterRegistry drafters,
                               DrafterMetrics* metrics)
    : options_(options),
      drafters_(std::move(drafters)),
      info_(MakeInfo(options_, drafters_)),
      metrics_(metrics),
      pool_(options.worker_threads) {
  if (options_.session_idle_timeout > absl::ZeroDuration()) {
    reaper_ = std::thread([this] { ReapIdleSessions(); });
  }
}

DrafterService::~DrafterService() {
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void DrafterService::ReapIdleSessions() {
  const absl::Duration timeout = options_.session_idle_timeout;
  // A session ends between 1 and 1.25 timeouts after its last message (at most 1 s late).
  const absl::Duration period = std::min(timeout / 4, absl::Seconds(1));
  std::unique_lock<std::mutex> lock(sessions_mu_);
  while (
      !reaper_cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stopping_; })) {
    const absl::Time now = absl::Now();
    for (SessionReactor* session : sessions_) session->EndIfIdle(now, timeout);
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DrafterService::Draft(
    grpc::CallbackServerContext* /*context*/) {
  return new SessionReactor(this);
}

grpc::ServerUnaryReactor* DrafterService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::DrafterInfoRequest* /*request*/,
                                                  v1::DrafterInfo* info) {
  *info = info_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace treespec
