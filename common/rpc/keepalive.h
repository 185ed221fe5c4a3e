// Server-side HTTP/2 keepalive: a server pings each connection that has been quiet for a while
// and closes it (cancelling its calls) when the peer does not answer. That is how a server
// learns that a peer host died or was cut off without closing its connections (a killed
// process's kernel closes them; a lost host or a network partition does not).
#ifndef TREESPEC_COMMON_RPC_KEEPALIVE_H_
#define TREESPEC_COMMON_RPC_KEEPALIVE_H_

#include <grpcpp/server_builder.h>

namespace treespec {

// How long a ping may go unanswered before the connection counts as dead.
inline constexpr int kKeepaliveTimeoutS = 10;

// Pings a connection after `time_s` seconds without traffic and drops it when the ack has not
// come kKeepaliveTimeoutS later; also with calls open but idle (no limit on pings without
// data). Nothing when time_s <= 0. gRPC clients answer server pings without configuration.
void SetServerKeepalive(grpc::ServerBuilder& builder, int time_s);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_KEEPALIVE_H_
