// RoPE fused with writing K/V into the paged cache (DESIGN §3 step 1), with Qwen3's per-head
// q/k RMSNorm in front (bf16 data, fp32 arithmetic). Kernel: kernels/kv_write.cuh; CPU
// reference: per-head RmsNorm, RopeTables then ApplyRope (common/model/cpu_ops.h) and the K/V
// copy into the cache of CpuCausalLm's attention (common/model/cpu_causal_lm.cc).
#ifndef TREESPEC_COMMON_CUDA_KV_WRITE_H_
#define TREESPEC_COMMON_CUDA_KV_WRITE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda/paged_kv.h"

namespace treespec::gpu {

// For every row i (a token) and with h = head_dim / 2, in fp32 rounded once to bf16:
//   q = qkv[i, q heads], k = qkv[i, k heads]   (each per head, of head_dim elements)
//   q = q_norm * (q / sqrt(mean(q²) + eps))     when q_norm != nullptr, likewise k with k_norm
//   q, k rotated by the angles of positions[i], as LaunchRope (rope.h):
//     x[f] = x[f] * c - x[f + h] * s,  x[f + h] = x[f + h] * c + x[f] * s  for f in [0, h)
//   q_out[i]                    = q
//   layer K at slots[i], head j = k head j;  layer V at slots[i], head j = v head j (as is)
// Without norms q_out and K equal LaunchRope's output bit for bit; with them, the normalised
// values stay in fp32 (no bf16 rounding between the norm and the rotation).
//   qkv        [rows, num_q_heads + 2 * num_kv_heads, head_dim] bf16, device: the QKV
//              projection's output, bias added; q heads first, then k heads, then v heads
//   positions  [rows] int32, device: absolute positions (>= 0) of the rows' tokens
//   slots      [rows] int32, device: physical slot page * page_size + offset_in_page of the
//              row's K/V; a negative slot (or one >= num_pages * page_size) writes nothing of
//              that row's K/V (q_out is still written). Non-negative slots must be distinct.
//   inv_freq   [head_dim / 2] fp32, device: RoPE inverse frequencies, scaling applied
//   attention_factor: yarn's mscale (1 for every other scaling)
//   q_norm, k_norm [head_dim] bf16, device, or nullptr for none (each on its own)
//   q_out      [rows, num_q_heads, head_dim] bf16, device; must not overlap qkv or the pool
//   layer      one layer's K/V pool, [num_pages, num_kv_heads, page_size, head_dim] each
// Returns cudaErrorInvalidValue (nothing launched) for rows < 0, num_q_heads < 1,
// num_kv_heads < 1, an odd head_dim or one outside [2, 12288], or a layer whose num_kv_heads
// or head_dim differ from these or whose page_size < 1 or num_pages < 0; cudaSuccess without
// a launch for rows == 0; else the launch's error.
cudaError_t LaunchKvWrite(const __nv_bfloat16* qkv, int rows, int num_q_heads, int num_kv_heads,
                          int head_dim, const int32_t* positions, const int32_t* slots,
                          const float* inv_freq, float attention_factor,
                          const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm, float eps,
                          __nv_bfloat16* q_out, const KvLayerView& layer, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_KV_WRITE_H_
