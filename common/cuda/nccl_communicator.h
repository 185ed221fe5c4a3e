// The Communicator (common/model/communicator.h) over NCCL, for the GPUs of this process (one
// rank per GPU, one thread per rank: DESIGN §6). Buffers are device memory of the rank's GPU;
// collectives are enqueued on the caller's stream and return once enqueued, so a forward pass
// never waits on the host for them.
#ifndef TREESPEC_COMMON_CUDA_NCCL_COMMUNICATOR_H_
#define TREESPEC_COMMON_CUDA_NCCL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/communicator.h"

namespace treespec::gpu {

// One communicator per entry of `devices` (CUDA ordinals, distinct; element r is rank r's,
// bound to devices[r]). Each must then be used from one thread at a time, with that device
// current. INVALID_ARGUMENT for an empty list, a repeated or out-of-range device; UNAVAILABLE
// when NCCL cannot set the group up (its message included).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(
    absl::Span<const int> devices);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_NCCL_COMMUNICATOR_H_
