// Qwen3's per-head q/k RMSNorm and RoPE fused with writing K/V into the paged cache (DESIGN §3
// step 1). Launcher: kv_write.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_KV_WRITE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_KV_WRITE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/rope_table.cuh"
#include "common/cuda/paged_kv.h"

namespace treespec::gpu::kernels {

// Sum over aligned groups of kGroup lanes (a power of two dividing 32); every lane of a group
// gets its group's total. All 32 lanes of the warp must call it.
template <int kGroup>
__device__ __forceinline__ float GroupSum(float v) {
  static_assert(kGroup >= 1 && kGroup <= 32 && (kGroup & (kGroup - 1)) == 0,
                "kGroup is a power of two <= 32");
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// One block per row (token); within it, kGroup consecutive threads own one head of the row at a
// time: first the num_q_heads q heads, then the num_kv_heads k heads, then the v heads. With
// h = head_dim / 2, the thread with lane l of its group owns the element pairs (f, f + h) for
// f in packs l, l + kGroup, ... of kVec elements of [0, h).
//
// The block first builds the row's cos/sin table exactly as RopeKernel does (kernels/rope.cuh),
// so that without q/k norms the rotated q and k equal LaunchRope's bit for bit. Then, per head,
// in fp32 and rounded once to bf16 at the store:
//   q, k: y = norm ? weight * (x * inv_rms) : x, inv_rms = 1 / sqrt(sum(x²) / head_dim + eps)
//         (rms_norm.cuh's arithmetic; the sum of squares over the group's lanes), then
//         out[f]     = y[f] * cos[f] - y[f + h] * sin[f]
//         out[f + h] = y[f + h] * cos[f] + y[f] * sin[f]   (rope.cuh's explicit roundings);
//   v:    copied as is.
// q goes to q_out; k and v to the (page, head, offset) of the row's slot in `layer`, unless the
// slot is negative or beyond the pool (then nothing of the row's K/V is written).
//   qkv        [gridDim.x, num_q_heads + 2 * num_kv_heads, head_dim]
//   positions  [gridDim.x], slots [gridDim.x], inv_freq [head_dim / 2]
//   q_norm, k_norm [head_dim] or nullptr
//   q_out      [gridDim.x, num_q_heads, head_dim]
// blockDim.x is a multiple of 32 (whole warps for the shuffles); kVec = 8 needs head_dim % 16 ==
// 0 and 16-byte aligned qkv, q_out, layer.k, layer.v and norm weights.
// Dynamic shared memory: head_dim floats (cos then sin).
template <int kVec, int kGroup>
__global__ void KvWriteKernel(const __nv_bfloat16* __restrict__ qkv, int num_q_heads,
                              int num_kv_heads, int head_dim, const int32_t* __restrict__ positions,
                              const int32_t* __restrict__ slots, const float* __restrict__ inv_freq,
                              float attention_factor, const __nv_bfloat16* __restrict__ q_norm,
                              const __nv_bfloat16* __restrict__ k_norm, float eps,
                              __nv_bfloat16* __restrict__ q_out, KvLayerView layer) {
  AllowDependentLaunch();           // the tree attention may start on the committed prefix's K/V
  extern __shared__ float table[];  // [2, head_dim / 2]: cos, sin
  const int half = head_dim / 2;
  const int row = blockIdx.x;
  BuildRopeTable(table, half, positions[row], inv_freq, attention_factor);  // as RopeKernel
  __syncthreads();

  const int64_t slot = slots[row];
  const bool write_kv = slot >= 0 && slot < static_cast<int64_t>(layer.num_pages) * layer.page_size;
  const int page = write_kv ? static_cast<int>(slot / layer.page_size) : 0;
  const int offset = write_kv ? static_cast<int>(slot % layer.page_size) : 0;

  const int total_heads = num_q_heads + 2 * num_kv_heads;
  const __nv_bfloat16* in_row = qkv + static_cast<int64_t>(row) * total_heads * head_dim;
  const bool any_norm = q_norm != nullptr || k_norm != nullptr;  // uniform over the grid
  const int lane = threadIdx.x % kGroup;
  const int groups_per_block = blockDim.x / kGroup;
  const int num_packs = half / kVec;

  // head0 is uniform over the block, so every warp runs the same iterations (the shuffles in
  // GroupSum need all lanes).
  for (int head0 = 0; head0 < total_heads; head0 += groups_per_block) {
    const int head = head0 + static_cast<int>(threadIdx.x) / kGroup;
    const bool active = head < total_heads;
    const bool is_q = head < num_q_heads;
    const bool is_v = head >= num_q_heads + num_kv_heads;
    const __nv_bfloat16* norm = is_q ? q_norm : is_v ? nullptr : k_norm;
    __nv_bfloat16* out = nullptr;  // stays null for idle lanes and unwritten K/V
    if (active && is_q) {
      out = q_out + (static_cast<int64_t>(row) * num_q_heads + head) * head_dim;
    } else if (active && write_kv) {
      const int kv_head = head - num_q_heads - (is_v ? num_kv_heads : 0);
      out = (is_v ? layer.v : layer.k) + layer.Offset(page, kv_head, offset);
    }
    const __nv_bfloat16* in = in_row + static_cast<int64_t>(head) * head_dim;
    const int my_packs = out != nullptr ? num_packs : 0;  // idle lanes still shuffle

    float inv_rms = 1.0f;
    if (any_norm) {
      float sum_sq = 0.0f;
      if (norm != nullptr) {
        for (int p = lane; p < my_packs; p += kGroup) {
          const Floats<kVec> lo = LoadBf16<kVec>(in + p * kVec);
          const Floats<kVec> hi = LoadBf16<kVec>(in + half + p * kVec);
#pragma unroll
          for (int i = 0; i < kVec; ++i) sum_sq = fmaf(lo.v[i], lo.v[i], sum_sq);
#pragma unroll
          for (int i = 0; i < kVec; ++i) sum_sq = fmaf(hi.v[i], hi.v[i], sum_sq);
        }
      }
      sum_sq = GroupSum<kGroup>(sum_sq);
      inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(head_dim) + eps);
    }

    for (int p = lane; p < my_packs; p += kGroup) {
      Floats<kVec> lo = LoadBf16<kVec>(in + p * kVec);
      Floats<kVec> hi = LoadBf16<kVec>(in + half + p * kVec);
      if (is_v) {
        StoreBf16<kVec>(lo, out + p * kVec);  // exact: the values are bf16
        StoreBf16<kVec>(hi, out + half + p * kVec);
        continue;
      }
      if (norm != nullptr) {
        const Floats<kVec> w_lo = LoadBf16<kVec>(norm + p * kVec);
        const Floats<kVec> w_hi = LoadBf16<kVec>(norm + half + p * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          lo.v[i] = __fmul_rn(w_lo.v[i], __fmul_rn(lo.v[i], inv_rms));
          hi.v[i] = __fmul_rn(w_hi.v[i], __fmul_rn(hi.v[i], inv_rms));
        }
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const int f = p * kVec + i;
        const float a = lo.v[i], b = hi.v[i];
        const float c = table[f], s = table[half + f];
        lo.v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        hi.v[i] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
      }
      StoreBf16<kVec>(lo, out + p * kVec);
      StoreBf16<kVec>(hi, out + half + p * kVec);
    }
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_KV_WRITE_CUH_
