// Deterministic pseudo-random bf16 fill (benchmarks' random weights, made on the device).
#ifndef TREESPEC_COMMON_CUDA_KERNELS_RANDOM_FILL_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_RANDOM_FILL_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace treespec::gpu::kernels {

// SplitMix64 finaliser: a well-mixed 64-bit value of (seed, index).
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillUniformBf16Kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, float center,
                                      float half_width) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const uint64_t bits = Mix(seed * 0x100000001B3ull ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = __float2bfloat16_rn(center + half_width * (2.0f * u - 1.0f));
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_RANDOM_FILL_CUH_
