#include "verifier_service/drafter_client.h"

#include <grpc/grpc.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/draft_context_proto.h"
#include "common/rpc/health_checked_channel.h"
#include "common/rpc/keepalive.h"
#include "common/util/log.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {

// Whether the drafter link works, shared by every session of one GrpcDraftSource (so by every
// request): a drafter that goes down is one WARNING when the link breaks and one INFO when a
// session delivers again, not a line per request (a soak with the drafter killed now and then
// logged hundreds); the repeats in between are at DEBUG. Any thread.
class DrafterLinkState {
 public:
  explicit DrafterLinkState(std::string target) : target_(std::move(target)) {}

  // A session failed (or could not open).
  void Failed(const std::string& why) {
    if (!broken_.exchange(true)) {
      TS_LOG(kWarning,
             "drafter %s: draft session failed: %s; requests run without speculation until a "
             "session delivers again (further failures at DEBUG)",
             target_, why);
    } else {
      TS_LOG(kDebug, "drafter %s: draft session failed: %s", target_, why);
    }
  }

  // A session delivered a tree.
  void Delivered() {
    if (broken_.load(std::memory_order_relaxed) && broken_.exchange(false)) {
      TS_LOG(kInfo, "drafter %s: draft sessions deliver again", target_);
    }
  }

 private:
  const std::string target_;
  std::atomic<bool> broken_{false};  // since the last failure, no session has delivered
};

namespace {

// Records a drafter's statement (a GetInfo answer or a session's DraftOpened) in `directory`,
// logging a drafter heard from for the first time, or whose limits changed, once at INFO.
void HearDrafter(DrafterDirectory& directory, const v1::DrafterInfo& info,
                 const std::string& target) {
  const DrafterDescription drafter = FromProto(info);
  if (absl::Status valid = ValidateSpecBounds(drafter.spec); !valid.ok()) {
    TS_LOG(kDebug, "drafter %s (%s) states unusable limits, ignored: %s", drafter.id, target,
           std::string(valid.message()));
    return;
  }
  if (directory.Heard(drafter, absl::Now())) {
    TS_LOG(kInfo, "drafter %s (%s): serves %s at most (defaults %s), kinds %s", drafter.id, target,
           SpecLimitsString(drafter.spec.max), SpecLimitsString(drafter.spec.defaults),
           DrafterKindNames(drafter.kinds));
  }
}

// One Draft call. The reactor owns itself: it lives until gRPC calls OnDone, even after the
// stream has dropped it (which only cancels the call). State shared with the engine sits behind
// mu_.
class SessionReactor final : public grpc::ClientBidiReactor<v1::DraftRequest, v1::DraftResponse> {
 public:
  // `params.prompt` is the request's whole context so far; `link` learns how the call went.
  SessionReactor(v1::Drafter::Stub* stub, const DraftOpenParams& params,
                 std::function<void()> on_arrival, ServingMetrics* metrics,
                 std::shared_ptr<DrafterLinkState> link,
                 std::shared_ptr<DrafterDirectory> directory, std::string target)
      : on_arrival_(std::move(on_arrival)),
        metrics_(metrics),
        link_(std::move(link)),
        directory_(std::move(directory)),
        target_(std::move(target)) {
    v1::DraftRequest open;
    v1::DraftOpen* o = open.mutable_open();
    o->set_request_id(params.request_id);
    o->mutable_prompt_ids()->Add(params.prompt.begin(), params.prompt.end());
    o->set_mode(ToProtoMode(params.mode));
    o->set_tree_budget(params.limits.tree_budget);
    o->set_max_depth(params.limits.max_depth);
    o->set_top_k(params.limits.top_k);
    o->mutable_feature_layers()->Add(params.feature_layers.begin(), params.feature_layers.end());
    o->set_cached_tokens(params.cached_tokens);
    o->set_page_size(params.page_size);
    stub->async()->Draft(&context_, this);
    pending_.push_back(std::move(open));
    writing_ = true;
    StartWrite(&pending_.front());
    StartRead(&response_);
    // The hold keeps OnDone (and the reactor) back until the stream detaches, so the stream's
    // pointer never dangles; a dead call shows up as a failed read instead.
    AddHold();
    StartCall();
  }

  void Commit(int64_t step, const DraftContext& added, int tree_budget) {
    std::vector<v1::DraftRequest> parts = CommitParts(step, added);
    v1::DraftCommit* last = parts.back().mutable_commit();
    if (tree_budget == DraftStream::kNoTree) {
      last->set_no_tree(true);
    } else {
      last->set_tree_budget(tree_budget);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || detached_) return;
    last_commit_step_ = step;
    last_commit_sent_ = absl::Now();
    for (v1::DraftRequest& part : parts) pending_.push_back(std::move(part));
    if (!writing_) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }

  std::optional<DraftedTree> TakeTree(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!latest_.has_value() || latest_step_ != step) return std::nullopt;
    std::optional<DraftedTree> out = std::move(latest_);
    latest_.reset();
    return out;
  }

  int64_t TakeMisnumbered() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(misnumbered_, 0);
  }

  bool broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

  std::optional<int> opened_cached_tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_cached_;
  }

  // Whether a well-numbered tree ever arrived: the drafter was up and serving this session.
  bool delivered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return delivered_;
  }

  // The stream is done with this call: cancel it; OnDone frees the reactor. Returns only once
  // no arrival callback is running, so the engine may be destroyed next.
  void Detach() {
    {
      std::lock_guard<std::mutex> lock(notify_mu_);
      on_arrival_ = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      detached_ = true;
    }
    context_.TryCancel();
    RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.pop_front();
    if (!ok) {
      writing_ = false;
      return;  // the stream is broken; OnDone follows
    }
    if (!pending_.empty() && !detached_) {
      StartWrite(&pending_.front());
    } else {
      writing_ = false;
    }
  }

  void OnReadDone(bool ok) override {
    if (ok && response_.kind_case() == v1::DraftResponse::kOpened) {
      // The limits this session's trees obey, and who serves it: news for the pool's view.
      HearDrafter(*directory_, response_.opened().drafter(), target_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        opened_cached_ = response_.opened().cached_tokens();
      }
      {
        // A request whose prefill waits for which cached rows the drafter holds goes on.
        std::lock_guard<std::mutex> lock(notify_mu_);
        if (on_arrival_) on_arrival_();
      }
      StartRead(&response_);
      return;
    }
    bool tree_arrived = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        finished_ = true;  // the drafter closed or failed the stream (the stream reopens it)
      } else if (const v1::DraftTree& t = response_.tree();
                 response_.kind_case() != v1::DraftResponse::kTree || t.step() < 0 ||
                 t.step() > last_commit_step_) {
        ++misnumbered_;  // no tree, or answers no commit sent: garbage (older is merely stale)
      } else {
        DraftedTree tree;
        tree.tokens.assign(t.tokens().begin(), t.tokens().end());
        tree.parents.assign(t.parents().begin(), t.parents().end());
        tree.logprobs.assign(t.logprobs().begin(), t.logprobs().end());
        latest_step_ = t.step();
        latest_ = std::move(tree);
        delivered_ = true;
        tree_arrived = true;
        if (metrics_ != nullptr && latest_step_ == last_commit_step_) {
          metrics_->ObserveDrafterRoundTrip(absl::ToDoubleSeconds(absl::Now() - last_commit_sent_));
        }
      }
    }
    if (tree_arrived) link_->Delivered();
    // Not under mu_: the engine takes its own lock and then ours in TakeTree. Under notify_mu_,
    // which Detach takes too, so the callback never runs after the stream let go.
    {
      std::lock_guard<std::mutex> lock(notify_mu_);
      if (on_arrival_) on_arrival_();
    }
    if (ok) StartRead(&response_);
  }

  // Runs once the stream has detached and every operation has finished.
  void OnDone(const grpc::Status& status) override {
    // CANCELLED: the stream let go of the call (the request ended), not a failure.
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      link_->Failed(status.error_message());
    }
    delete this;
  }

 private:
  grpc::ClientContext context_;
  v1::DraftResponse response_;
  mutable std::mutex mu_;
  std::mutex notify_mu_;  // held while on_arrival_ runs (before the engine's mutex, never after)
  std::function<void()> on_arrival_;      // guarded by notify_mu_
  std::deque<v1::DraftRequest> pending_;  // front() is being written while writing_
  bool writing_ = false;
  bool finished_ = false;
  bool detached_ = false;
  bool delivered_ = false;
  std::optional<int> opened_cached_;  // DraftOpened.cached_tokens, once it arrived
  std::optional<DraftedTree> latest_;
  int64_t latest_step_ = -1;
  int64_t misnumbered_ = 0;
  ServingMetrics* const metrics_;  // may be null
  const std::shared_ptr<DrafterLinkState> link_;
  const std::shared_ptr<DrafterDirectory> directory_;
  const std::string target_;
  int64_t last_commit_step_ = -1;  // the newest commit and when it was handed to gRPC
  absl::Time last_commit_sent_;
};

// One request's drafting: a session, and a new one (after a backoff) whenever it breaks. Used
// by the engine thread only.
class GrpcDraftStream final : public DraftStream {
 public:
  GrpcDraftStream(v1::Drafter::Stub* stub, DraftOpenParams params, std::function<void()> on_arrival,
                  ServingMetrics* metrics, const BackoffOptions& reconnect,
                  std::shared_ptr<DrafterLinkState> link,
                  std::shared_ptr<DrafterDirectory> directory, std::string target)
      : stub_(stub),
        open_(std::move(params)),
        on_arrival_(std::move(on_arrival)),
        metrics_(metrics),
        link_(std::move(link)),
        directory_(std::move(directory)),
        target_(std::move(target)),
        backoff_(reconnect) {
    session_ = NewSession();
  }
  ~GrpcDraftStream() override {
    if (session_ != nullptr) session_->Detach();
  }

  void Commit(int64_t step, DraftContext added, int tree_budget) override {
    const absl::Time now = absl::Now();
    if (session_ != nullptr && session_->broken()) DropSession(now);
    // A new session's context is everything before this commit, which it then gets like any
    // other. Target features are not kept (a long context's rows run to gigabytes), so a session
    // that took them is not reopened: the request goes on without speculation.
    if (session_ == nullptr && now >= next_attempt_ && !sent_features_) {
      session_ = NewSession();
      if (metrics_ != nullptr) metrics_->OnDraftSessionReopened();
    }
    sent_features_ = sent_features_ || !added.features.empty();
    open_.prompt.insert(open_.prompt.end(), added.tokens.begin(), added.tokens.end());
    open_.cached_tokens = 0;  // a reopened session is sent its whole context
    if (session_ != nullptr) session_->Commit(step, added, tree_budget);
  }

  std::optional<DraftedTree> TakeTree(int64_t step) override {
    return session_ != nullptr ? session_->TakeTree(step) : std::nullopt;
  }

  int64_t TakeMisnumberedTrees() override {
    const int64_t n = std::exchange(misnumbered_, 0);
    return session_ != nullptr ? n + session_->TakeMisnumbered() : n;
  }

  bool broken() const override { return session_ == nullptr || session_->broken(); }

  std::optional<int> opened_cached_tokens() const override {
    return session_ != nullptr ? session_->opened_cached_tokens() : std::nullopt;
  }

 private:
  SessionReactor* NewSession() {
    return new SessionReactor(stub_, open_, on_arrival_, metrics_, link_, directory_, target_);
  }

  // The session broke: let it go and set when the next one may open.
  void DropSession(absl::Time now) {
    misnumbered_ += session_->TakeMisnumbered();
    const bool was_serving = session_->delivered();
    if (was_serving) backoff_.Reset();  // a fresh failure, not one more failed attempt
    const absl::Duration delay = backoff_.NextDelay();
    next_attempt_ = now + delay;
    // Why it ended went to the link state; that the link is down is its line, not each
    // request's.
    if (was_serving) {
      TS_LOG(kDebug,
             "request %s: draft session ended; without speculation until it reopens "
             "(first try in %s)",
             open_.request_id, absl::FormatDuration(delay));
    }
    session_->Detach();
    session_ = nullptr;
  }

  v1::Drafter::Stub* const stub_;
  DraftOpenParams open_;  // prompt: the request's whole context so far (prompt + commits)
  const std::function<void()> on_arrival_;
  ServingMetrics* const metrics_;  // may be null
  const std::shared_ptr<DrafterLinkState> link_;
  const std::shared_ptr<DrafterDirectory> directory_;
  const std::string target_;
  Backoff backoff_;
  SessionReactor* session_ = nullptr;  // null between a break and the next attempt
  absl::Time next_attempt_ = absl::InfinitePast();
  int64_t misnumbered_ = 0;  // from sessions already dropped
  bool sent_features_ = false;
};

// Channel-level reconnects (a drafter address that refused or dropped the connection) back off
// like the sessions do; keepalive finds drafters that stopped answering without closing.
grpc::ChannelArguments LinkArguments(const DrafterLinkOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.reconnect.initial)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.reconnect.max)));
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  SetClientKeepalive(args, options.keepalive_s);
  return args;
}

}  // namespace

// Sessions go round-robin over every address the target resolves to (a headless Service's pods
// through dns:///), skipping those whose grpc.health.v1 status is not SERVING (a draining or
// loading drafter); each session is one stream, so it stays on the replica that opened it.
GrpcDraftSource::GrpcDraftSource(const std::string& target,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 DrafterLinkOptions options)
    : target_(target),
      options_(options),
      link_(std::make_shared<DrafterLinkState>(target)),
      directory_(std::make_shared<DrafterDirectory>(options.info_ttl)),
      channel_(HealthCheckedChannel(target, credentials, LinkArguments(options))),
      stub_(v1::Drafter::NewStub(channel_)) {
  if (options_.info_period > absl::ZeroDuration()) {
    // A channel of its own: its round-robin turns are not the sessions', so polling never
    // skews how sessions spread over the drafters.
    info_stub_ = v1::Drafter::NewStub(
        HealthCheckedChannel(target, std::move(credentials), LinkArguments(options)));
    info_poller_ = std::thread([this] { PollInfo(); });
  }
}

GrpcDraftSource::~GrpcDraftSource() {
  {
    std::lock_guard<std::mutex> lock(poll_mu_);
    stopping_ = true;
    if (info_call_ != nullptr) info_call_->TryCancel();
  }
  poll_cv_.notify_all();
  if (info_poller_.joinable()) info_poller_.join();
}

// Asks the pool what it serves: every second until a drafter answers (so admission knows the
// limits from the first requests on), then every info_period. Each call goes to the next
// drafter round-robin, so over a few periods every drafter is heard from even with no traffic;
// sessions (DraftOpened) refresh the drafters they land on as well.
void GrpcDraftSource::PollInfo() {
  bool heard = false;
  std::unique_lock<std::mutex> lock(poll_mu_);
  while (!stopping_) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    info_call_ = &context;
    lock.unlock();
    v1::DrafterInfo info;
    const grpc::Status status = info_stub_->GetInfo(&context, v1::DrafterInfoRequest(), &info);
    if (status.ok()) {
      heard = true;
      HearDrafter(*directory_, info, target_);
    } else {
      TS_LOG(kDebug, "drafter %s: GetInfo: %s", target_, status.error_message());
    }
    lock.lock();
    info_call_ = nullptr;
    const absl::Duration wait = heard ? options_.info_period : absl::Seconds(1);
    poll_cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [this] { return stopping_; });
  }
}

std::unique_ptr<DraftStream> GrpcDraftSource::Open(const DraftOpenParams& params,
                                                   std::function<void()> on_arrival) {
  return std::make_unique<GrpcDraftStream>(stub_.get(), params, std::move(on_arrival),
                                           metrics_.load(), options_.reconnect, link_, directory_,
                                           target_);
}

DrafterPoolInfo GrpcDraftSource::PoolInfo() const { return directory_->Pool(absl::Now()); }

}  // namespace treespec
