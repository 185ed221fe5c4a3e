#include <algorithm>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/silu_mul.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/silu_mul.h"

namespace treespec::gpu {

cudaError_t LaunchSiluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                          int rows, int cols, __nv_bfloat16* out, cudaStream_t stream) {
  if (rows < 0 || cols < 1 || in_stride < cols) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Grid-stride loop: enough blocks to fill any GPU many times over, few enough that a block
  // has a handful of packs when the tensor is large.
  constexpr int64_t kMaxBlocks = 8192;
  const bool vec = cols % kernels::kBf16PerPack == 0 && in_stride % kernels::kBf16PerPack == 0 &&
                   internal::Aligned16(gate) && internal::Aligned16(up) && internal::Aligned16(out);
  const int vec_width = vec ? kernels::kBf16PerPack : 1;
  const int64_t packs = static_cast<int64_t>(rows) * (cols / vec_width);
  const int blocks = static_cast<int>(std::min(internal::CeilDiv(packs, kThreads), kMaxBlocks));
  if (vec) {
    kernels::SiluMulKernel<kernels::kBf16PerPack>
        <<<blocks, kThreads, 0, stream>>>(gate, up, in_stride, rows, cols, out);
  } else {
    kernels::SiluMulKernel<1>
        <<<blocks, kThreads, 0, stream>>>(gate, up, in_stride, rows, cols, out);
  }
  return cudaGetLastError();
}

}  // namespace treespec::gpu
