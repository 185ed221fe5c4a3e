// Top-k log-probs of a logits row (see LaunchTopKLogProbs in top_k_logprobs.h). One CTA per row:
//  1. max (BlockArgmax), then the double sum of exp(x - max) over warps in a fixed order: lse;
//  2. the k-th largest 64-bit key K(i) = (ordered bits of lp_i = logit i - lse) << id_bits |
//     (vocab - 1 - i) by the sampling kernel's radix descent (TopKThreshold, choose_token.cuh),
//     so {K >= t} is exactly the k best tokens, ties by lower id. Keys rank the rounded log-prob,
//     not the logit, as the CPU does: two logits a float ulp apart can round to the same lp,
//     which is then a tie broken by the id;
//  3. those k keys into shared memory (any order), a bitonic sort, descending;
//  4. thread j writes rank j: the id from the key's low bits and logit - lse.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_TOP_K_LOGPROBS_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_TOP_K_LOGPROBS_CUH_

#include <cstdint>

#include "common/cuda/kernels/choose_token.cuh"
#include "common/cuda/top_k_logprobs.h"

namespace treespec::gpu::kernels {

// OrderedBits for ranking: every non-finite logit (NaN, -inf) below every finite one.
__device__ __forceinline__ uint32_t RankBits(float f) { return isfinite(f) ? OrderedBits(f) : 0u; }

// The block's sum of one double per thread, added warp by warp in a fixed order (deterministic).
template <int kThreads>
__device__ double BlockSum(double v) {
  __shared__ double warp_sum[kThreads / 32];
  __shared__ double total;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) t = __dadd_rn(t, warp_sum[w]);
    total = t;
  }
  __syncthreads();
  return total;
}

// Sorts keys[0, n) descending in place (n a power of two, <= kMaxTopKLogProbs).
template <int kThreads>
__device__ void BitonicSortDescending(uint64_t* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const bool descending = (i & size) == 0;
        const uint64_t a = keys[i], b = keys[j];
        if ((a < b) == descending) {
          keys[i] = b;
          keys[j] = a;
        }
      }
      __syncthreads();
    }
  }
}

//   logits [gridDim.x, vocab], tokens / logprobs [gridDim.x, k]
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    TopKLogProbsKernel(const float* __restrict__ logits, int vocab, int k,
                       int32_t* __restrict__ tokens, float* __restrict__ logprobs) {
  __shared__ ChooseScratch s;
  __shared__ uint64_t keys[kMaxTopKLogProbs];
  __shared__ int kept;
  const int row = blockIdx.x;
  const float* __restrict__ x = logits + static_cast<int64_t>(row) * vocab;

  const float max = BlockArgmax<kThreads>(x, vocab).value;
  double part = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    part = __dadd_rn(part, exp(static_cast<double>(__fsub_rn(x[i], max))));
  }
  const float lse = __fadd_rn(max, static_cast<float>(log(BlockSum<kThreads>(part))));

  const int id_bits = vocab > 1 ? 32 - __clz(vocab - 1) : 0;
  const uint64_t id_mask = (uint64_t{1} << id_bits) - 1;
  const auto key = [&](int i) {
    return (static_cast<uint64_t>(RankBits(__fsub_rn(x[i], lse))) << id_bits) |
           static_cast<uint64_t>(vocab - 1 - i);
  };
  const uint64_t keep_from =
      k < vocab ? TopKThreshold<kThreads>(key, vocab, 32 + id_bits, k, s) : 0;
  if (threadIdx.x == 0) kept = 0;
  int padded = 1;
  while (padded < k) padded <<= 1;
  for (int j = threadIdx.x; j < padded; j += kThreads) keys[j] = 0;  // pads sort last
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint64_t k_i = key(i);
    if (k_i >= keep_from) keys[atomicAdd(&kept, 1)] = k_i;  // exactly k of them
  }
  __syncthreads();
  BitonicSortDescending<kThreads>(keys, padded);
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const int32_t id = vocab - 1 - static_cast<int32_t>(keys[j] & id_mask);
    tokens[static_cast<int64_t>(row) * k + j] = id;
    logprobs[static_cast<int64_t>(row) * k + j] = __fsub_rn(x[id], lse);  // the ranked value
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_TOP_K_LOGPROBS_CUH_
