#include "common/rpc/keepalive.h"

#include <grpc/grpc.h>

namespace treespec {

void SetServerKeepalive(grpc::ServerBuilder& builder, int time_s) {
  if (time_s <= 0) return;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, time_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutS * 1000);
  // By default a server stops pinging after two pings without data frames in between, so a
  // peer that dies during a long silence would go unnoticed.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace treespec
