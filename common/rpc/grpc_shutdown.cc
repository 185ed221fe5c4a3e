#include "common/rpc/grpc_shutdown.h"

#include <grpc/grpc.h>

#include <cstdio>

#include "absl/time/clock.h"

namespace treespec {

bool AwaitGrpcShutdown(absl::Duration timeout) {
  // grpc_is_initialized() takes the lock the shutdown holds from start to end, so "false" means
  // the shutdown finished, not merely that it began.
  const absl::Time deadline = absl::Now() + timeout;
  while (grpc_is_initialized() != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

int AfterGrpcShutdown(int exit_code) {
  if (!AwaitGrpcShutdown(absl::Seconds(10))) {
    std::fputs("gRPC was still running 10 s after the last object went; exiting anyway\n", stderr);
  }
  return exit_code;
}

}  // namespace treespec
