// The second launch of a split tree attention (DESIGN §3 step 2): one CTA per AttnMergeItem
// combines the normalised partial outputs of a split tile's CTAs for a few of its rows by
// log-sum-exp, so the partials of one tile are read by many SMs at once. Launched as a
// programmatic dependent of the attention kernel: it reads its item before
// griddepcontrol.wait and the partials after it.
//
// A CTA copies every split's partial rows and log-sum-exps into shared memory with cp.async
// (all loads in flight at once), turns the log-sum-exps into weights (a warp per row), then sums
// the splits per (row, 4 columns) in a fixed order, so the result does not depend on the order
// the splits finished in.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/mma.cuh"
#include "common/cuda/tree_attention_plan.h"

namespace treespec::gpu::kernels {

inline constexpr int kAttnMergeThreads = 128;

// Element offset in out ([query rows, num_q_heads, head_dim]) of column 0 of row tr of a (sequence,
// KV head)'s query rows: node row q_row_begin + tr / heads_here, q head q_head0 + tr % heads_here.
__device__ __forceinline__ int64_t AttnOutOffset(int q_row_begin, int tr, int heads_here,
                                                 int num_q_heads, int q_head0, int head_dim) {
  return (static_cast<int64_t>(q_row_begin + tr / heads_here) * num_q_heads + q_head0 +
          tr % heads_here) *
         head_dim;
}

// Shared memory of a merge CTA: partial rows of every split (at most 64 + kAttnMaxSplits of
// them, AttnMergeRows), their log-sum-exps (then weights), each row's 1 / (sum of weights), and
// one float4 per thread for the split lanes' sums.
template <int kHeadDim>
__host__ __device__ constexpr int AttnMergeSharedBytes() {
  constexpr int kRowsTimesSplits = kAttnSmallTileRows + kAttnMaxSplits;
  return kRowsTimesSplits * (kHeadDim + 1) * 4 + kAttnSmallTileRows * 4 + kAttnMergeThreads * 16;
}

struct TreeAttentionMergeArgs {
  __nv_bfloat16* out;           // [query rows, num_q_heads, D]
  const AttnMergeItem* merges;  // merge_slots of them, the first *num_merges in use
  const int32_t* num_merges;    // CTAs past *num_merges exit (the grid may be a fixed capacity)
  const float* partial_out;     // [partial slots, tile_rows, D]
  const float* partial_lse;     // [partial slots, tile_rows], log2 domain
  int merge_slots;
  int tile_rows;
  int num_q_heads;
  int group_size;
  int q_head_shift;
};

template <int kHeadDim>
__global__ void __launch_bounds__(kAttnMergeThreads)
    TreeAttentionMergeKernel(const TreeAttentionMergeArgs args) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  constexpr int D = kHeadDim;
  constexpr int kColGroups = D / 4;  // float4 columns
  constexpr int kWarps = kAttnMergeThreads / 32;
  const int bid = blockIdx.x;
  const AttnMergeItem m = bid < args.merge_slots ? args.merges[bid] : AttnMergeItem{};
  if (bid >= *args.num_merges) {
    // The next kernel's griddepcontrol.wait waits for this grid only: one CTA waiting for the
    // attention keeps its output complete before this grid is (also when no tile needs a merge).
    if (bid == 0) WaitForPriorGrid();
    return;
  }
  const int q_head0 = max(0, m.kv_head * args.group_size - args.q_head_shift);
  const int heads_here =
      min(args.num_q_heads, (m.kv_head + 1) * args.group_size - args.q_head_shift) - q_head0;
  const int splits = m.num_splits, rows = m.rows;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float4* const lane_sums = reinterpret_cast<float4*>(smem_raw);  // [kAttnMergeThreads]
  float* const values = reinterpret_cast<float*>(lane_sums + kAttnMergeThreads);  // [s][r][D]
  float* const weights = values + splits * rows * D;                              // [s][r]
  float* const inv_sum = weights + splits * rows;                                 // [r]

  WaitForPriorGrid();  // the attention kernel's partials
  const int64_t slot_row0 =
      static_cast<int64_t>(m.partial_base) * args.tile_rows + (m.row_begin - m.tile_row_begin);
  for (int idx = tid; idx < splits * rows * kColGroups; idx += kAttnMergeThreads) {
    const int col = idx % kColGroups, sr = idx / kColGroups;  // sr = split * rows + row
    const int s = sr / rows, r = sr % rows;
    const float* src =
        args.partial_out + (slot_row0 + static_cast<int64_t>(s) * args.tile_rows + r) * D + col * 4;
    CpAsync16(SharedAddress(values + sr * D + col * 4), src, 16);
  }
  CpAsyncCommit();
  for (int sr = tid; sr < splits * rows; sr += kAttnMergeThreads) {
    const int s = sr / rows, r = sr % rows;
    weights[sr] =
        __ldcg(args.partial_lse + slot_row0 + static_cast<int64_t>(s) * args.tile_rows + r);
  }
  __syncthreads();
  // Weights: one warp per row, lanes over the splits (at most 64), butterfly reductions.
  for (int r = warp; r < rows; r += kWarps) {
    float lse[2], w[2];
    float lse_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = lane + 32 * k;
      lse[k] = s < splits ? weights[s * rows + r] : -INFINITY;
      lse_max = fmaxf(lse_max, lse[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
      lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, o));
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      // -inf: the split saw no visible key for this row.
      w[k] = lse[k] == -INFINITY ? 0.0f : exp2f(lse[k] - lse_max);
      sum += w[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (lane + 32 * k < splits) weights[(lane + 32 * k) * rows + r] = w[k];
    }
    if (lane == 0) inv_sum[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Sums: tasks are (row, 4 columns); when there are fewer tasks than threads, `lanes` threads
  // share a task, each summing every lanes-th split from its own, then thread 0 of the task adds
  // the lanes' sums in lane order.
  const int tasks = rows * kColGroups;
  int lanes = 1;
  while (lanes < 8 && 2 * lanes * tasks <= kAttnMergeThreads) lanes *= 2;
  for (int base = 0; base < tasks; base += kAttnMergeThreads / lanes) {
    const int task = base + tid % (kAttnMergeThreads / lanes),
              my_lane = tid / (kAttnMergeThreads / lanes);
    const bool active = task < tasks && my_lane < lanes;
    const int r = task / kColGroups, col = (task % kColGroups) * 4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
#pragma unroll 4
      for (int s = my_lane; s < splits; s += lanes) {
        const float wt = weights[s * rows + r];
        const float4 x = *reinterpret_cast<const float4*>(values + (s * rows + r) * D + col);
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
      }
    }
    lane_sums[tid] = acc;
    __syncthreads();
    if (active && my_lane == 0) {
      for (int k = 1; k < lanes; ++k) {
        const float4 x = lane_sums[tid + k * (kAttnMergeThreads / lanes)];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      }
      const float inv = inv_sum[r];
      __nv_bfloat16* const dst =
          args.out +
          AttnOutOffset(m.q_row_begin, m.row_begin + r, heads_here, args.num_q_heads, q_head0, D) +
          col;
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(PackBf16(acc.x * inv, acc.y * inv), PackBf16(acc.z * inv, acc.w * inv));
    }
    __syncthreads();  // lane_sums is rewritten by the next round
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_
