#include "common/rpc/health_checked_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace treespec {

std::shared_ptr<grpc::Channel> HealthCheckedChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials,
    grpc::ChannelArguments args) {
  args.SetServiceConfigJSON(
      R"({"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}})");
  return grpc::CreateCustomChannel(
      target, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
}

}  // namespace treespec
