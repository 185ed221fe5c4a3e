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
  // A client's pings: by default a server counts one closer than 5 minutes after the last
  // (or, with no call open, 2 hours) as a strike and sends GOAWAY "too_many_pings" after the
  // third, dropping the connection. Half the interval leaves room for a late ack or a delayed
  // ping; the strikes (gRPC's default 2) stay for clients that ping faster than that.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             time_s * 1000 / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

void SetClientKeepalive(grpc::ChannelArguments& args, int time_s) {
  if (time_s <= 0) return;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, time_s * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutS * 1000);
  // An idle link is pinged too, so a drafter that vanished is noticed before a session needs it.
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // By default a client sends at most two pings without data in between, so keepalive would
  // stop during a long silence.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace treespec
