// The second launch of a split tree attention (DESIGN §3 step 2): one CTA per AttnMergeItem
// combines the normalised partial outputs of a split tile's CTAs for a few of its rows by
// log-sum-exp, so the partials of one tile are read by many SMs at once. Launched as a
// programmatic dependent of the attention kernel: it reads its item before
// griddepcontrol.wait and the partials after it.
//
// A CTA copies every split's partial rows and log-sum-exps into shared memory with cp.async
// (all loads in flight at once), then thread (row, 4 columns) sums the splits in split order,
// so the result does not depend on the order the splits finished in.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/mma.cuh"
#include "common/cuda/paged_kv.h"
#include "common/cuda/tree_attention_plan.h"

namespace treespec::gpu::kernels {

inline constexpr int kAttnMergeThreads = 128;

// Shared memory of a merge CTA: partial rows of every split (at most 64 + kAttnMaxSplits of
// them, AttnMergeRows), their log-sum-exps (then weights), and each row's 1 / (sum of weights).
template <int kHeadDim>
__host__ __device__ constexpr int AttnMergeSharedBytes() {
  constexpr int kRowsTimesSplits = kAttnSmallTileRows + kAttnMaxSplits;
  return kRowsTimesSplits * (kHeadDim + 1) * 4 + kAttnSmallTileRows * 4;
}

struct TreeAttentionMergeArgs {
  __nv_bfloat16* out;  // [query rows, num_q_heads, D]
  const AttnSeqInfo* seqs;
  const int32_t* num_items;   // the attention's items; the merge items follow them
  const int32_t* num_merges;  // CTAs past *num_merges exit (the grid may be a fixed capacity)
  const AttnWorkItem* items;
  const float* partial_out;  // [partial slots, tile_rows, D]
  const float* partial_lse;  // [partial slots, tile_rows], log2 domain
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
  if (static_cast<int>(blockIdx.x) >= *args.num_merges) return;
  const AttnMergeItem m =
      reinterpret_cast<const AttnMergeItem*>(args.items + *args.num_items)[blockIdx.x];
  const AttnSeqInfo seq = args.seqs[m.seq];
  const int q_head0 = max(0, m.kv_head * args.group_size - args.q_head_shift);
  const int heads_here =
      min(args.num_q_heads, (m.kv_head + 1) * args.group_size - args.q_head_shift) - q_head0;
  const int splits = m.num_splits, rows = m.rows;
  const int tid = threadIdx.x;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const values = reinterpret_cast<float*>(smem_raw);  // [splits][rows][D]
  float* const weights = values + splits * rows * D;         // [splits][rows]
  float* const inv_sum = weights + splits * rows;            // [rows]

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
  for (int r = tid; r < rows; r += kAttnMergeThreads) {
    float lse_max = -INFINITY;
    for (int s = 0; s < splits; ++s) lse_max = fmaxf(lse_max, weights[s * rows + r]);
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float lse = weights[s * rows + r];
      // -inf: the split saw no visible key (exp2(-inf - x) would be 0 too, but not for x = -inf).
      const float w = lse == -INFINITY ? 0.0f : exp2f(lse - lse_max);
      weights[s * rows + r] = w;
      sum += w;
    }
    inv_sum[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  CpAsyncWait<0>();
  __syncthreads();

  for (int idx = tid; idx < rows * kColGroups; idx += kAttnMergeThreads) {
    const int r = idx / kColGroups, col = (idx % kColGroups) * 4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float w = weights[s * rows + r];
      const float4 x = *reinterpret_cast<const float4*>(values + (s * rows + r) * D + col);
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
    }
    const float inv = inv_sum[r];
    const int tr = m.row_begin + r;
    __nv_bfloat16* const dst =
        args.out +
        (static_cast<int64_t>(seq.q_row_begin + tr / heads_here) * args.num_q_heads + q_head0 +
         tr % heads_here) *
            D +
        col;
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(PackBf16(acc.x * inv, acc.y * inv), PackBf16(acc.z * inv, acc.w * inv));
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_MERGE_CUH_
