#include "common/cuda/kernels/random_fill.cuh"
#include "common/cuda/random_fill.h"

namespace treespec::gpu {

cudaError_t LaunchFillUniformBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float center,
                                  float half_width, cudaStream_t stream) {
  if (n < 0 || (n > 0 && out == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  kernels::FillUniformBf16Kernel<<<static_cast<int>(blocks < 8192 ? blocks : 8192), kThreads, 0,
                                   stream>>>(out, n, seed, center, half_width);
  return cudaGetLastError();
}

}  // namespace treespec::gpu
