// DraftSource over gRPC: one Drafter.Draft bidi stream per request, driven by a callback
// reactor so the engine never blocks on the network.
#ifndef TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_
#define TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <memory>
#include <string>

#include "treespec/v1/drafter.grpc.pb.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/serving_metrics.h"

namespace treespec {

class GrpcDraftSource final : public DraftSource {
 public:
  // `target` is any gRPC target ("127.0.0.1:50061", "dns:///drafter:50061", "ipv4:a:p,b:q").
  // Sessions are spread round-robin over the addresses it resolves to that report SERVING on
  // grpc.health.v1, so adding drafter replicas behind a headless Service spreads the load.
  // `credentials`: plaintext when null (tls.h makes TLS ones).
  explicit GrpcDraftSource(const std::string& target,
                           std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return target_; }
  // Where draft round-trip times go (null: nowhere); set before sessions open. Must outlive
  // the sessions.
  void SetMetrics(ServingMetrics* metrics) { metrics_.store(metrics); }

 private:
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Drafter::Stub> stub_;
  std::atomic<ServingMetrics*> metrics_{nullptr};
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_DRAFTER_CLIENT_H_
