// Server side of discovery (issue 4): a server that closes each connection after a maximum age
// makes its clients re-resolve their target, so replicas added behind a DNS name (a headless
// Service) start getting calls from clients that were already connected. Calls running when
// the age is reached may finish within the grace period.
#ifndef TREESPEC_COMMON_RPC_CONNECTION_AGE_H_
#define TREESPEC_COMMON_RPC_CONNECTION_AGE_H_

#include <grpcpp/server_builder.h>

namespace treespec {

// Sets GRPC_ARG_MAX_CONNECTION_AGE_MS to `age_s` seconds (nothing when age_s <= 0) and the
// grace to max(1, grace_s) seconds.
void SetMaxConnectionAge(grpc::ServerBuilder& builder, int age_s, int grace_s);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_CONNECTION_AGE_H_
