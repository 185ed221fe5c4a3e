// DraftSource over gRPC: one Drafter.Draft bidi stream per request, driven by a callback
// reactor so the engine never blocks on the network. A session that breaks (drafter crash,
// restart, hang-up, oversized message) is reopened with the request's whole context after a
// jittered exponential backoff; the request runs without speculation meanwhile. What the
// drafters serve (their limits and kinds) is learnt from Drafter.GetInfo, polled, and from
// every session's DraftOpened (DrafterDirectory).
#ifndef TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_
#define TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/util/backoff.h"
#include "treespec/v1/drafter.grpc.pb.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/drafter_directory.h"
#include "verifier_service/serving_metrics.h"

namespace treespec {

struct DrafterLinkOptions {
  // Between attempts to reopen one request's broken session, and between the channel's attempts
  // to reconnect to a drafter address (gRPC's own backoff, which defaults to a 120 s cap: far
  // too long to notice a restarted drafter).
  BackoffOptions reconnect;
  // Largest DraftResponse accepted, in bytes; a larger one breaks the session
  // (RESOURCE_EXHAUSTED), which is then reopened.
  int max_message_bytes = 4 << 20;
  // A drafter connection quiet this long is pinged and dropped, failing its sessions (which
  // are reopened), when no ack comes within kKeepaliveTimeoutS (common/rpc/keepalive.h): that
  // is how a drafter host that vanished, or a drafter that hangs, is noticed. 0 = off.
  int keepalive_s = 30;
  // Drafter.GetInfo is asked this often (every second until a drafter answers); 0 = never
  // (the pool is then learnt from sessions only).
  absl::Duration info_period = absl::Seconds(10);
  // A drafter not heard from this long is dropped from the pool's limits.
  absl::Duration info_ttl = absl::Minutes(10);
};

class DrafterLinkState;

class GrpcDraftSource final : public DraftSource {
 public:
  // `target` is any gRPC target ("127.0.0.1:50061", "dns:///drafter:50061", "ipv4:a:p,b:q").
  // Sessions are spread round-robin over the addresses it resolves to that report SERVING on
  // grpc.health.v1, so adding drafter replicas behind a headless Service spreads the load.
  // `credentials`: plaintext when null (tls.h makes TLS ones). `options` must pass
  // ValidateBackoffOptions.
  explicit GrpcDraftSource(const std::string& target,
                           std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                           DrafterLinkOptions options = {});
  ~GrpcDraftSource() override;
  GrpcDraftSource(const GrpcDraftSource&) = delete;
  GrpcDraftSource& operator=(const GrpcDraftSource&) = delete;

  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return target_; }
  DrafterPoolInfo PoolInfo() const override;
  // Where draft round-trip times and session reopens go (null: nowhere); set before sessions
  // open. Must outlive the sessions.
  void SetMetrics(ServingMetrics* metrics) { metrics_.store(metrics); }

 private:
  void PollInfo();

  std::string target_;
  DrafterLinkOptions options_;
  // Shared with the sessions (which may outlive this): logs the link breaking and recovering.
  std::shared_ptr<DrafterLinkState> link_;
  std::shared_ptr<DrafterDirectory> directory_;  // shared with the sessions, as link_
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Drafter::Stub> stub_;
  std::unique_ptr<v1::Drafter::Stub> info_stub_;  // GetInfo's own channel; null: no polling
  std::atomic<ServingMetrics*> metrics_{nullptr};
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;           // with poll_mu_: wakes the poller to stop
  bool stopping_ = false;                     // guarded by poll_mu_
  grpc::ClientContext* info_call_ = nullptr;  // the GetInfo in flight; guarded by poll_mu_
  std::thread info_poller_;                   // last: stops before the members above go
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_
