#include "common/rpc/connection_age.h"

#include <grpc/grpc.h>

#include <algorithm>

namespace treespec {

void SetMaxConnectionAge(grpc::ServerBuilder& builder, int age_s, int grace_s) {
  if (age_s <= 0) return;
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, age_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, std::max(1, grace_s) * 1000);
}

}  // namespace treespec
