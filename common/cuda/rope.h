// Rotary position embedding on the GPU (bf16 data, fp32 arithmetic), rotate-half convention
// (Hugging Face Llama). Kernel: kernels/rope.cuh; CPU reference: RopeTables then ApplyRope
// (common/model/cpu_ops.h).
#ifndef TREESPEC_COMMON_CUDA_ROPE_H_
#define TREESPEC_COMMON_CUDA_ROPE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// Rotates every head of row i by the angles of positions[i], in place, with h = head_dim / 2:
//   angle[f] = fp32(float(positions[i]) * inv_freq[f])
//   c = cos(angle[f]) * attention_factor, s = sin(angle[f]) * attention_factor
//   x[f] = x[f] * c - x[f + h] * s,  x[f + h] = x[f + h] * c + x[f] * s      for f in [0, h).
// inv_freq carries the RoPE scaling (default, linear, llama3, yarn...) already applied;
// attention_factor is yarn's mscale (1 for every other scaling).
//   x          [rows, num_heads, head_dim] bf16, device, in place
//   positions  [rows] int32, device: absolute positions (>= 0) of the rows' tokens
//   inv_freq   [head_dim / 2] fp32, device
// Returns cudaErrorInvalidValue for rows < 0, num_heads < 1 or an odd or non-positive head_dim
// (nothing launched); cudaSuccess without a launch for rows == 0; else the launch's error.
cudaError_t LaunchRope(__nv_bfloat16* x, int rows, int num_heads, int head_dim,
                       const int32_t* positions, const float* inv_freq, float attention_factor,
                       cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_ROPE_H_
