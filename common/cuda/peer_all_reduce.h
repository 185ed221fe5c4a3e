// Tensor-parallel all-reduce of a row-parallel GEMM's partial sums fused with the residual add
// and RMSNorm after it, over NVLink peer access (kernels/peer_all_reduce.cuh): one kernel
// instead of an NCCL all-reduce plus a norm, with a deterministic rank-order sum. Used when
// every pair of the ranks' GPUs has peer access; the model falls back to NCCL otherwise.
#ifndef TREESPEC_COMMON_CUDA_PEER_ALL_REDUCE_H_
#define TREESPEC_COMMON_CUDA_PEER_ALL_REDUCE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/device_buffer.h"

namespace treespec::gpu {

// The mailboxes and flags of a group of GPUs of this process (one rank per GPU).
class PeerReduceGroup {
 public:
  // Enables peer access between all pairs of `devices` and allocates, on each, two mailboxes of
  // `mailbox_elements` bf16 and the barrier flags. Returns nullptr (no error) when some pair
  // has no peer access, or for one device; INVALID_ARGUMENT for more than 8 devices.
  static absl::StatusOr<std::unique_ptr<PeerReduceGroup>> Create(absl::Span<const int> devices,
                                                                 size_t mailbox_elements);
  ~PeerReduceGroup();
  PeerReduceGroup(const PeerReduceGroup&) = delete;
  PeerReduceGroup& operator=(const PeerReduceGroup&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  // Where rank `rank` writes its partial sums for call number `epoch` (>= 1; every rank numbers
  // its calls 1, 2, ... in the same order).
  __nv_bfloat16* mailbox(int rank, uint64_t epoch) { return mailboxes_[rank][epoch % 2].data(); }

  // On rank `rank`'s stream (its device current), after every rank's partials of call `epoch`
  // are in its mailbox(rank, epoch) (stream order on each rank):
  //   x[i, :] = bf16(x[i, :] + bf16(sum over ranks of the partials))   (= the sum without
  //             add_residual);   out[i, :] = RMSNorm(x[i, :]) · weight     (as LaunchRmsNorm)
  // for rows i < rows. Every rank must make the same calls with the same rows and epochs; a
  // rank that waits more than `timeout_ms` for the others traps (the device is then unusable).
  // Returns cudaErrorInvalidValue for rows outside [0, mailbox rows], n < 1 or a rank out of
  // range (nothing launched); else the launch's error.
  cudaError_t Launch(int rank, uint64_t epoch, int rows, __nv_bfloat16* x, bool add_residual,
                     const __nv_bfloat16* weight, int n, float eps, __nv_bfloat16* out,
                     cudaStream_t stream, int timeout_ms = 10000);

 private:
  PeerReduceGroup(std::vector<int> devices, size_t mailbox_elements)
      : devices_(std::move(devices)), mailbox_elements_(mailbox_elements) {}

  std::vector<int> devices_;
  size_t mailbox_elements_;
  std::vector<std::array<DeviceBuffer<__nv_bfloat16>, 2>> mailboxes_;  // [rank][parity]
  std::vector<DeviceBuffer<uint64_t>> flags_;             // [rank]
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_PEER_ALL_REDUCE_H_
