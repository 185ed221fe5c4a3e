// HTTP/2 keepalive: a peer pings a connection that has been quiet for a while and closes it
// (failing its calls) when no ack comes. That is how one side learns that the other's host died,
// was cut off or hangs without closing its connections (a killed process's kernel closes them; a
// lost host, a network partition or a stopped process does not). Servers ping their clients, and
// the verifier pings its drafters; each server accepts pings from a client that uses the same
// interval.
#ifndef TREESPEC_COMMON_RPC_KEEPALIVE_H_
#define TREESPEC_COMMON_RPC_KEEPALIVE_H_

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace treespec {

// How long a ping may go unanswered before the connection counts as dead.
inline constexpr int kKeepaliveTimeoutS = 10;

// Pings a connection after `time_s` seconds without traffic and drops it when the ack has not
// come kKeepaliveTimeoutS later; also with calls open but idle (no limit on pings without
// data). Accepts client pings every time_s / 2 or slower, with or without calls, so a client of
// SetClientKeepalive with the same time_s is never sent GOAWAY "too_many_pings". Nothing when
// time_s <= 0 (gRPC's defaults then: clients may ping every 5 minutes, and only during calls).
void SetServerKeepalive(grpc::ServerBuilder& builder, int time_s);

// The client side: a channel with these arguments pings its connections after `time_s` seconds
// without traffic, with or without calls open, and drops one (failing its calls, which then
// reconnect) when no ack comes within kKeepaliveTimeoutS. The server must accept pings that
// often (SetServerKeepalive with time_s no more than twice this). Nothing when time_s <= 0.
void SetClientKeepalive(grpc::ChannelArguments& args, int time_s);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_KEEPALIVE_H_
