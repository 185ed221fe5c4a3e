#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/peer_all_reduce.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/peer_all_reduce.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {

absl::StatusOr<std::unique_ptr<PeerReduceGroup>> PeerReduceGroup::Create(
    absl::Span<const int> devices, size_t mailbox_elements) {
  const int n = static_cast<int>(devices.size());
  if (n > kernels::kPeerMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer all-reduce: ", n, " GPUs, at most ", kernels::kPeerMaxRanks));
  }
  if (n < 2) return std::unique_ptr<PeerReduceGroup>();
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) return std::unique_ptr<PeerReduceGroup>();
    }
  }
  std::unique_ptr<PeerReduceGroup> group(
      new PeerReduceGroup(std::vector<int>(devices.begin(), devices.end()), mailbox_elements));
  group->mailboxes_.resize(n);
  for (int r = 0; r < n; ++r) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    for (int peer : devices) {
      if (peer == devices[r]) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears it
      } else {
        CUDA_RETURN_IF_ERROR(e);
      }
    }
    for (int parity = 0; parity < 2; ++parity) {
      ASSIGN_OR_RETURN(group->mailboxes_[r][parity],
                       DeviceBuffer<__nv_bfloat16>::Create(mailbox_elements));
    }
    ASSIGN_OR_RETURN(
        DeviceBuffer<uint64_t> flags,
        DeviceBuffer<uint64_t>::Create(kernels::kPeerMaxBlocks * kernels::kPeerMaxRanks));
    RETURN_IF_ERROR(flags.ZeroNow());
    group->flags_.push_back(std::move(flags));
  }
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return group;
}

PeerReduceGroup::~PeerReduceGroup() = default;

cudaError_t PeerReduceGroup::Launch(int rank, uint64_t epoch, int rows, __nv_bfloat16* x,
                                    bool add_residual, const __nv_bfloat16* weight, int n,
                                    float eps, __nv_bfloat16* out, cudaStream_t stream,
                                    int timeout_ms) {
  if (rank < 0 || rank >= ranks() || n < 1 || rows < 0 || epoch == 0 ||
      static_cast<size_t>(rows) * n > mailbox_elements_) {
    return cudaErrorInvalidValue;
  }
  // Every rank launches the same grid (even for rows == 0, so the barriers pair up).
  kernels::PeerReduceArgs a{};
  for (int q = 0; q < ranks(); ++q) {
    a.partial[q] = mailboxes_[q][epoch % 2].data();
    a.flags[q] = flags_[q].data();
  }
  a.ranks = ranks();
  a.rank = rank;
  a.epoch = epoch;
  a.timeout_ns = static_cast<uint64_t>(timeout_ms) * 1000000ull;
  const int blocks = std::clamp(rows, 1, kernels::kPeerMaxBlocks);
  constexpr int kMaxThreads = 1024;
  bool vec = n % kernels::kBf16PerPack == 0 && internal::Aligned16(x) &&
             internal::Aligned16(weight) && internal::Aligned16(out);
  for (int q = 0; q < ranks(); ++q) vec = vec && internal::Aligned16(a.partial[q]);
  if (vec) {
    const int threads = internal::RowBlockThreads(n / kernels::kBf16PerPack, kMaxThreads);
    kernels::PeerAllReduceRmsNormKernel<kernels::kBf16PerPack>
        <<<blocks, threads, 0, stream>>>(a, rows, x, add_residual, weight, n, eps, out);
  } else {
    const int threads = internal::RowBlockThreads(n, kMaxThreads);
    kernels::PeerAllReduceRmsNormKernel<1>
        <<<blocks, threads, 0, stream>>>(a, rows, x, add_residual, weight, n, eps, out);
  }
  return cudaGetLastError();
}

}  // namespace treespec::gpu
