// The one place where absl::Status becomes grpc::Status (and back).
#ifndef TREESPEC_COMMON_RPC_STATUS_CONVERSION_H_
#define TREESPEC_COMMON_RPC_STATUS_CONVERSION_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace treespec {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_STATUS_CONVERSION_H_
