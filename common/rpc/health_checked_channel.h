// Client channels that spread calls over every address a target resolves to (round_robin) and
// skip the servers whose grpc.health.v1 status is not SERVING (client-side health checking):
// a loading or draining replica gets no new calls, and an added one starts getting them.
// The verifier reaches its drafters this way, and treespec-loadgen its verifiers.
#ifndef TREESPEC_COMMON_RPC_HEALTH_CHECKED_CHANNEL_H_
#define TREESPEC_COMMON_RPC_HEALTH_CHECKED_CHANNEL_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

namespace treespec {

// A channel to `target` ("host:port", "dns:///name:port", "ipv4:a:p,b:q") with round_robin and
// health checking, plaintext unless `credentials` say otherwise (tls.h). With no healthy
// address its state is TRANSIENT_FAILURE and calls without wait_for_ready fail at once with
// UNAVAILABLE. `args` may add settings (backoff, message sizes); its service config is replaced.
std::shared_ptr<grpc::Channel> HealthCheckedChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    grpc::ChannelArguments args = {});

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_HEALTH_CHECKED_CHANNEL_H_
