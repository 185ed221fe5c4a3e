#include "verifier_service/drafter_client.h"

#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/health_checked_channel.h"
#include "common/util/log.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {

namespace {

// The reactor owns itself: it lives until gRPC calls OnDone, even after the engine has dropped
// its handle (which only cancels the call). State shared with the engine sits behind mu_.
class SessionReactor final : public grpc::ClientBidiReactor<v1::DraftRequest, v1::DraftResponse> {
 public:
  SessionReactor(v1::Drafter::Stub* stub, const DraftOpenParams& params,
                 std::function<void()> on_arrival, ServingMetrics* metrics)
      : on_arrival_(std::move(on_arrival)), metrics_(metrics) {
    v1::DraftRequest open;
    v1::DraftOpen* o = open.mutable_open();
    o->set_request_id(params.request_id);
    o->mutable_prompt_ids()->Add(params.prompt.begin(), params.prompt.end());
    o->set_mode(ToProtoMode(params.mode));
    o->set_tree_budget(params.tree_budget);
    o->set_max_depth(params.max_depth);
    stub->async()->Draft(&context_, this);
    pending_.push_back(std::move(open));
    writing_ = true;
    StartWrite(&pending_.front());
    StartRead(&response_);
    // The hold keeps OnDone (and the reactor) back until the engine detaches, so the engine's
    // handle never dangles; a dead stream shows up as a failed read instead.
    AddHold();
    StartCall();
  }

  void Commit(int64_t step, std::vector<int32_t> tokens) {
    v1::DraftRequest request;
    request.mutable_commit()->set_step(step);
    request.mutable_commit()->mutable_tokens()->Add(tokens.begin(), tokens.end());
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || detached_) return;
    last_commit_step_ = step;
    last_commit_sent_ = absl::Now();
    pending_.push_back(std::move(request));
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

  bool broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

  // The engine is done with this session: cancel the call; OnDone frees the reactor.
  // Returns only once no arrival callback is running, so the engine may be destroyed next.
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ok) {
        const v1::DraftTree& t = response_.tree();
        DraftedTree tree;
        tree.tokens.assign(t.tokens().begin(), t.tokens().end());
        tree.parents.assign(t.parents().begin(), t.parents().end());
        tree.logprobs.assign(t.logprobs().begin(), t.logprobs().end());
        latest_step_ = t.step();
        latest_ = std::move(tree);
        if (metrics_ != nullptr && latest_step_ == last_commit_step_) {
          metrics_->ObserveDrafterRoundTrip(absl::ToDoubleSeconds(absl::Now() - last_commit_sent_));
        }
      } else {
        finished_ = true;  // the drafter closed or failed the stream
        if (!detached_) TS_LOG(kWarning, "draft stream ended; continuing without speculation");
      }
    }
    // Not under mu_: the engine takes its own lock and then ours in TakeTree. Under notify_mu_,
    // which Detach takes too, so the callback never runs after the engine let go.
    {
      std::lock_guard<std::mutex> lock(notify_mu_);
      if (on_arrival_) on_arrival_();
    }
    if (ok) StartRead(&response_);
  }

  // Runs once the engine has detached and every operation has finished.
  void OnDone(const grpc::Status& status) override {
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      TS_LOG(kWarning, "draft session ended: %s", status.error_message());
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
  std::optional<DraftedTree> latest_;
  int64_t latest_step_ = -1;
  ServingMetrics* const metrics_;  // may be null
  int64_t last_commit_step_ = -1;  // the newest commit and when it was handed to gRPC
  absl::Time last_commit_sent_;
};

class GrpcDraftStream final : public DraftStream {
 public:
  explicit GrpcDraftStream(SessionReactor* reactor) : reactor_(reactor) {}
  ~GrpcDraftStream() override { reactor_->Detach(); }

  void Commit(int64_t step, std::vector<int32_t> tokens) override {
    reactor_->Commit(step, std::move(tokens));
  }
  std::optional<DraftedTree> TakeTree(int64_t step) override { return reactor_->TakeTree(step); }
  bool broken() const override { return reactor_->broken(); }

 private:
  SessionReactor* reactor_;  // alive until Detach releases its hold
};

}  // namespace

// Sessions go round-robin over every address the target resolves to (a headless Service's pods
// through dns:///), skipping those whose grpc.health.v1 status is not SERVING (a draining or
// loading drafter); each session is one stream, so it stays on the replica that opened it.
GrpcDraftSource::GrpcDraftSource(const std::string& target,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials)
    : target_(target),
      channel_(HealthCheckedChannel(target, std::move(credentials))),
      stub_(v1::Drafter::NewStub(channel_)) {}

std::unique_ptr<DraftStream> GrpcDraftSource::Open(const DraftOpenParams& params,
                                                   std::function<void()> on_arrival) {
  return std::make_unique<GrpcDraftStream>(
      new SessionReactor(stub_.get(), params, std::move(on_arrival), metrics_.load()));
}

}  // namespace treespec
