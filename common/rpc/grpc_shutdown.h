// The end of a binary's gRPC lifetime.
#ifndef TREESPEC_COMMON_RPC_GRPC_SHUTDOWN_H_
#define TREESPEC_COMMON_RPC_GRPC_SHUTDOWN_H_

#include "absl/time/time.h"

namespace treespec {

// Waits until gRPC's library has shut down (its executor, timer and poller threads joined);
// false if `timeout` passed first. Call it after the last gRPC object is destroyed, before the
// process exits.
//
// gRPC shuts down when the last object that initialised it goes. The C-core channel behind a
// destroyed grpc::Channel is torn down asynchronously, so that last release often happens on
// one of gRPC's own threads, and then the shutdown runs on a detached thread that races the
// process exit: exit handlers run while gRPC's threads still live. Under LeakSanitizer that is
// a "leak" of the OpenSSL error state a TLS handshake left on an executor thread, and an
// intermittent abort of a client over TLS on busy cores.
bool AwaitGrpcShutdown(absl::Duration timeout);

// For the end of main: `return AfterGrpcShutdown(Run());` with every gRPC object inside Run.
// Returns `exit_code` once gRPC has shut down, or after 10 s with a line on stderr.
int AfterGrpcShutdown(int exit_code);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_GRPC_SHUTDOWN_H_
