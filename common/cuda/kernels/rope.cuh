// Rotary position embedding, rotate-half convention (Hugging Face Llama). Launcher: rope.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_ROPE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_ROPE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/rope_table.cuh"

namespace treespec::gpu::kernels {

// One block per row (token). The block first builds the row's cos/sin table in shared memory,
// with the CPU reference's math (RopeTables in common/model/cpu_ops.h):
//   angle[f] = fp32(float(position) * inv_freq[f]), cos[f] = cos(angle) * attention_factor,
// then rotates every head of the row in place, with h = head_dim / 2:
//   x[f]     = x[f] * cos[f] - x[f + h] * sin[f]
//   x[f + h] = x[f + h] * cos[f] + x[f] * sin[f]      in fp32, rounded once to bf16.
//   x [gridDim.x, num_heads, head_dim], positions [gridDim.x], inv_freq [head_dim / 2].
// Dynamic shared memory: head_dim floats (cos then sin).
__global__ void RopeKernel(__nv_bfloat16* __restrict__ x, int num_heads, int head_dim,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, float attention_factor) {
  extern __shared__ float table[];  // [2, head_dim / 2]: cos, sin
  const int half = head_dim / 2;
  const int row = blockIdx.x;
  BuildRopeTable(table, half, positions[row], inv_freq, attention_factor);
  __syncthreads();

  __nv_bfloat16* xr = x + static_cast<int64_t>(row) * num_heads * head_dim;
  const int num_pairs = num_heads * half;
  for (int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
    const int head = p / half, f = p % half;
    __nv_bfloat16* v = xr + head * head_dim + f;
    const float a = __bfloat162float(v[0]), b = __bfloat162float(v[half]);
    const float c = table[f], s = table[half + f];
    // Explicit roundings: no FMA contraction, so only cos/sin differ from the CPU reference.
    v[0] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    v[half] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_ROPE_CUH_
