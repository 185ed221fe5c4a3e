// Token choice (DESIGN §3 step 3): argmax, and temperature / top-k / top-p sampling by inverse
// CDF, one CTA per logits row. Launchers: choose_token.{h,cu}; CPU reference: ChooseToken in
// common/model/sampling.cc, whose header comment fixes the algorithm reproduced here.
//
// Sampling without a sort. Every token gets a 64-bit key K(i) = (ordered bits of logit i) <<
// id_bits | (vocab - 1 - i): K orders tokens by logit descending, then id ascending — the order
// in which the CPU takes top-k and top-p (+0 and -0 get the same bits, as they compare equal).
// Keys are distinct, so "the m first tokens in that order" is the set {K >= t} for one
// threshold t, found by a radix descent over K (8 bits per pass over the row, at most
// ceil((32 + id_bits) / 8) passes, stopping as soon as the chosen digit's bin holds exactly the
// tokens wanted):
//   top-k: t_k = the k-th largest key (bins count tokens);
//   top-p: t_p = the key of the first token (in K order, among K >= t_k) at which the running
//          mass reaches top_p * (mass of K >= t_k) (bins sum probabilities);
//   then the inverse CDF over {K >= max(t_k, t_p)} in id order: per-warp segment sums, then
//   per-thread chunk sums of the crossing segment, then one thread walks its chunk.
// Probabilities p(i) = exp(z_i - max_z) are computed in double exactly as the CPU does (no FMA
// contraction: explicit _rn intrinsics) and held as 128-bit fixed point floor(p * 2^83), so every
// sum is exact and independent of order, block size and atomics (deterministic run to run).
#ifndef TREESPEC_COMMON_CUDA_KERNELS_CHOOSE_TOKEN_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_CHOOSE_TOKEN_CUH_

#include <cstdint>

#include "common/cuda/choose_token.h"
#include "common/cuda/kernels/philox.cuh"

namespace treespec::gpu::kernels {

using U128 = unsigned __int128;

inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int32_t kNoIndex = INT32_MAX;  // an argmax candidate that saw no element

// ---- Warp helpers over 32-bit and 128-bit unsigned values ----

__device__ __forceinline__ uint32_t ShflUp(uint32_t v, int delta) {
  return __shfl_up_sync(kFullMask, v, delta);
}
__device__ __forceinline__ U128 ShflUp(U128 v, int delta) {
  const unsigned long long lo =
      __shfl_up_sync(kFullMask, static_cast<unsigned long long>(v), delta);
  const unsigned long long hi =
      __shfl_up_sync(kFullMask, static_cast<unsigned long long>(v >> 64), delta);
  return (static_cast<U128>(hi) << 64) | lo;
}
__device__ __forceinline__ uint32_t Shfl(uint32_t v, int src) {
  return __shfl_sync(kFullMask, v, src);
}
__device__ __forceinline__ U128 Shfl(U128 v, int src) {
  const unsigned long long lo = __shfl_sync(kFullMask, static_cast<unsigned long long>(v), src);
  const unsigned long long hi =
      __shfl_sync(kFullMask, static_cast<unsigned long long>(v >> 64), src);
  return (static_cast<U128>(hi) << 64) | lo;
}

// Inclusive prefix sum over the lanes of a full warp.
template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int delta = 1; delta < 32; delta <<= 1) {
    const T up = ShflUp(v, delta);
    if (lane >= delta) v += up;
  }
  return v;
}

// Sum over a full warp; every lane gets it (exact: unsigned integers).
template <typename T>
__device__ __forceinline__ T WarpTotal(T v) {
  return Shfl(WarpInclusiveScan(v), 31);
}

__device__ __forceinline__ int32_t WarpMax(int32_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// ---- Argmax ----

struct ArgmaxPair {
  float value;
  int32_t index;  // kNoIndex: none seen
};

// Whether (value, index) beats `best`: larger value, then lower index; an empty pair never wins
// and anything beats an empty pair. Values are visited in increasing index within a thread, so
// "strictly larger" keeps the first of equal maxima, as the CPU's Argmax does.
__device__ __forceinline__ bool Beats(float value, int32_t index, const ArgmaxPair& best) {
  if (index == kNoIndex) return false;
  if (best.index == kNoIndex) return true;
  return value > best.value || (value == best.value && index < best.index);
}

// (max, lowest index attaining it) of x[0, n) for the whole block; every thread gets it.
// Indices are local to x. blockDim.x == kThreads, a multiple of 32. Call once per kernel.
template <int kThreads>
__device__ ArgmaxPair BlockArgmax(const float* __restrict__ x, int n) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  __shared__ ArgmaxPair warp_best[kThreads / 32];
  __shared__ ArgmaxPair block_best;
  ArgmaxPair best{-INFINITY, kNoIndex};
  if (n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int p = threadIdx.x; p < n / 4; p += kThreads) {
      const float4 v = x4[p];
      if (Beats(v.x, 4 * p, best)) best = {v.x, 4 * p};
      if (Beats(v.y, 4 * p + 1, best)) best = {v.y, 4 * p + 1};
      if (Beats(v.z, 4 * p + 2, best)) best = {v.z, 4 * p + 2};
      if (Beats(v.w, 4 * p + 3, best)) best = {v.w, 4 * p + 3};
    }
  } else {
    for (int i = threadIdx.x; i < n; i += kThreads) {
      if (Beats(x[i], i, best)) best = {x[i], i};
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const ArgmaxPair other{__shfl_xor_sync(kFullMask, best.value, offset),
                           __shfl_xor_sync(kFullMask, best.index, offset)};
    if (Beats(other.value, other.index, best)) best = other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (Beats(warp_best[w].value, warp_best[w].index, best)) best = warp_best[w];
    }
    block_best = best;
  }
  __syncthreads();
  return block_best;
}

// One CTA per row of a vocabulary slice; see LaunchArgmaxPartial.
//   logits [gridDim.x, vocab_slice], max_out [gridDim.x] or nullptr, idx_out [gridDim.x]
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    ArgmaxPartialKernel(const float* __restrict__ logits, int vocab_slice, int vocab_offset,
                        float* __restrict__ max_out, int32_t* __restrict__ idx_out) {
  const int row = blockIdx.x;
  const ArgmaxPair best =
      BlockArgmax<kThreads>(logits + static_cast<int64_t>(row) * vocab_slice, vocab_slice);
  if (threadIdx.x == 0) {
    if (max_out != nullptr) max_out[row] = best.value;
    idx_out[row] = vocab_offset + best.index;
  }
}

// One thread per row; see LaunchArgmaxCombine.
//   max_in, idx_in [ranks, rows], tokens [rows]
// static: this header's device helpers are shared with other ops' kernels
// (top_k_logprobs.cuh), so its plain kernels get one copy per translation unit.
static __global__ void ArgmaxCombineKernel(const float* __restrict__ max_in,
                                           const int32_t* __restrict__ idx_in, int ranks, int rows,
                                           int32_t* __restrict__ tokens) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  ArgmaxPair best{-INFINITY, kNoIndex};
  for (int q = 0; q < ranks; ++q) {
    const int64_t at = static_cast<int64_t>(q) * rows + row;
    if (Beats(max_in[at], idx_in[at], best)) best = {max_in[at], idx_in[at]};
  }
  tokens[row] = best.index;
}

// ---- Sampling ----

// floor(x * 2^83) for 0 <= x < 2^23 as hi = floor(x * 2^40) and lo = the next 43 bits; every
// step is exact in double. For a probability (x <= 1) hi <= 2^40 and lo < 2^43, so a sum of
// up to 2^21 of them fits each 64-bit half (shared-memory atomics add the halves separately).
struct Fixed {
  unsigned long long hi, lo;
};
inline constexpr int kFixedLoBits = 43;

__device__ __forceinline__ Fixed ToFixed(double x) {
  const double scaled = x * 0x1.0p40;
  const double hi = floor(scaled);
  return {static_cast<unsigned long long>(hi),
          static_cast<unsigned long long>(floor((scaled - hi) * 0x1.0p43))};
}
__device__ __forceinline__ U128 Widen(Fixed f) {
  return (static_cast<U128>(f.hi) << kFixedLoBits) + f.lo;
}
__device__ __forceinline__ U128 Widen(unsigned long long hi, unsigned long long lo) {
  return Widen(Fixed{hi, lo});
}
// The fixed-point value as a double (two roundings: within 2 ulps).
__device__ __forceinline__ double FixedToDouble(U128 v) {
  const double hi = static_cast<double>(static_cast<unsigned long long>(v >> 64));
  const double lo = static_cast<double>(static_cast<unsigned long long>(v));
  return __dadd_rn(hi * 0x1.0p64, lo) * 0x1.0p-83;
}

// Order-preserving bits of a logit: a > b  <=>  OrderedBits(a) > OrderedBits(b) for non-NaN
// floats, with +0 and -0 mapped alike (they compare equal on the CPU).
__device__ __forceinline__ uint32_t OrderedBits(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// p = exp(logit * inv_t - max_z) in double, as sampling.cc computes it, as fixed point. Below
// exp(-58) < 2^-83 the fixed-point value is 0, so exp is skipped there (and for NaN).
__device__ __forceinline__ Fixed ProbFixed(float logit, double inv_t, double max_z) {
  const double d = __dsub_rn(__dmul_rn(static_cast<double>(logit), inv_t), max_z);
  if (!(d >= -58.0)) return {0, 0};
  return ToFixed(exp(d));
}

// Shared memory of one sampling CTA.
struct ChooseScratch {
  uint32_t count[256];              // tokens per digit bin
  unsigned long long mass_hi[256];  // probability per digit bin (Fixed halves)
  unsigned long long mass_lo[256];
  U128 warp_part[32];     // per-warp sums
  int32_t warp_last[32];  // per-warp largest kept id
  int selected_bin;
  uint32_t selected_above;  // tokens in bins above the selected one
  int32_t token;
};

// Run by one full warp. The bins nb - 1, nb - 2, ..., 0 (nb <= 256) hold get(b) >= 0. Returns
// the first bin b, from the top, at which the running sum reaches need (> 0), and in *above the
// sum over the bins before it; -1 if the total is below need. Lane l owns bins nb-1-8l down to
// nb-8-8l: a warp scan of the lanes' sums finds the lane, which then scans its own bins.
template <typename T, typename Get>
__device__ int SelectBinFromTop(const Get& get, int nb, T need, T* above) {
  const int lane = threadIdx.x % 32;
  const int top = nb - 1 - 8 * lane;
  T group = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (top - j >= 0) group += get(top - j);
  }
  const T inclusive = WarpInclusiveScan(group);
  const unsigned hits = __ballot_sync(kFullMask, inclusive >= need);
  if (hits == 0) return -1;
  const int src = __ffs(static_cast<int>(hits)) - 1;
  int bin = -1;
  T run = inclusive - group;
  if (lane == src) {
    for (int j = 0; j < 8 && top - j >= 0; ++j) {
      const T v = get(top - j);
      if (run + v >= need) {
        bin = top - j;
        break;
      }
      run += v;
    }
  }
  *above = Shfl(run, src);
  return __shfl_sync(kFullMask, bin, src);
}

__device__ __forceinline__ unsigned long long WarpSumU64(unsigned long long v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Adds each lane's token (and, kWithMass, its probability p) to digit bin `bin` of the block
// histogram; lanes with bin < 0 add nothing. Called by whole warps. Early radix passes put most
// of the vocabulary into one or two bins, where per-lane shared atomics would serialise, so
// lanes sharing a bin are first summed over the warp (exact: integers) and their leader adds
// once; lanes alone in their bin add directly.
template <bool kWithMass>
__device__ __forceinline__ void HistogramAdd(int bin, Fixed p, ChooseScratch& s) {
  const int lane = threadIdx.x % 32;
  const unsigned peers = __match_any_sync(kFullMask, bin);
  const bool alone = __popc(peers) == 1;
  if (bin >= 0 && alone) {
    atomicAdd(&s.count[bin], 1u);
    if constexpr (kWithMass) {
      if (p.hi != 0) atomicAdd(&s.mass_hi[bin], p.hi);
      if (p.lo != 0) atomicAdd(&s.mass_lo[bin], p.lo);
    }
  }
  // One warp reduction per shared bin, led by the group's lowest lane.
  unsigned leaders = __ballot_sync(kFullMask, bin >= 0 && !alone && lane == __ffs(peers) - 1);
  while (leaders != 0) {
    const int leader = __ffs(static_cast<int>(leaders)) - 1;
    leaders &= leaders - 1;
    const unsigned group = __shfl_sync(kFullMask, peers, leader);
    if constexpr (kWithMass) {
      const bool member = ((group >> lane) & 1u) != 0;
      const unsigned long long hi = WarpSumU64(member ? p.hi : 0ull);
      const unsigned long long lo = WarpSumU64(member ? p.lo : 0ull);
      if (lane == leader) {
        atomicAdd(&s.mass_hi[bin], hi);
        atomicAdd(&s.mass_lo[bin], lo);
      }
    }
    if (lane == leader) atomicAdd(&s.count[bin], static_cast<uint32_t>(__popc(group)));
  }
}

// The k-th largest key among the row's tokens (0 < k < vocab): top-k keeps {K >= result}.
template <int kThreads, typename KeyFn>
__device__ uint64_t TopKThreshold(const KeyFn& key, int vocab, int key_bits, int k,
                                  ChooseScratch& s) {
  uint64_t prefix = 0, prefix_mask = 0;
  uint32_t need = static_cast<uint32_t>(k);  // keys still to take within the prefix group
  for (int hi = key_bits; hi > 0; hi -= 8) {
    const int width = min(8, hi), shift = hi - width;
    const uint32_t digit_mask = (1u << width) - 1;
    for (int b = threadIdx.x; b < 256; b += kThreads) s.count[b] = 0;
    __syncthreads();
    // Token i = base + lane: thread t takes t, t + kThreads, ... with whole warps in step.
    for (int base = static_cast<int>(threadIdx.x / 32 * 32); base < vocab; base += kThreads) {
      const int i = base + static_cast<int>(threadIdx.x % 32);
      int bin = -1;
      if (i < vocab) {
        const uint64_t k_i = key(i);
        if ((k_i & prefix_mask) == prefix) bin = static_cast<int>((k_i >> shift) & digit_mask);
      }
      HistogramAdd<false>(bin, Fixed{0, 0}, s);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      uint32_t above = 0;
      const int bin =
          SelectBinFromTop<uint32_t>([&](int b) { return s.count[b]; }, 1 << width, need, &above);
      if (threadIdx.x == 0) {
        s.selected_bin = bin;
        s.selected_above = above;
      }
    }
    __syncthreads();
    // The group holds >= need keys, so a bin is always found.
    const int bin = s.selected_bin;
    need -= s.selected_above;
    prefix |= static_cast<uint64_t>(bin) << shift;
    prefix_mask |= static_cast<uint64_t>(digit_mask) << shift;
    const bool whole_bin = s.count[bin] == need;
    __syncthreads();  // all reads of s done before the next pass clears it
    if (whole_bin) break;
  }
  return prefix;  // zeros below the last digit: {K >= prefix} is exactly the k kept keys
}

// Top-p among the kept keys {K >= keep_from}: the threshold t such that {K >= t} (within the
// kept keys) is the shortest prefix in K order whose mass reaches top_p * (kept mass); at least
// one token. The result may lie below keep_from (its digits below the stopping pass are zero and
// that bin may hold dropped keys): the kept set is {K >= max(keep_from, result)}. Returns
// keep_from when the target is not reached (only by rounding).
template <int kThreads, typename KeyFn, typename ProbFn>
__device__ uint64_t TopPThreshold(const KeyFn& key, const ProbFn& prob, int vocab, int key_bits,
                                  uint64_t keep_from, float top_p, ChooseScratch& s) {
  uint64_t prefix = 0, prefix_mask = 0;
  // Held by warp 0 only, which selects the bins.
  U128 target = 0;  // top_p * kept mass, fixed point
  U128 above = 0;   // mass of the kept keys above the current prefix group
  for (int hi = key_bits; hi > 0; hi -= 8) {
    const int width = min(8, hi), shift = hi - width;
    const uint32_t digit_mask = (1u << width) - 1;
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      s.count[b] = 0;
      s.mass_hi[b] = 0;
      s.mass_lo[b] = 0;
    }
    __syncthreads();
    for (int base = static_cast<int>(threadIdx.x / 32 * 32); base < vocab; base += kThreads) {
      const int i = base + static_cast<int>(threadIdx.x % 32);
      int bin = -1;
      Fixed p{0, 0};
      if (i < vocab) {
        const uint64_t k_i = key(i);
        if (k_i >= keep_from && (k_i & prefix_mask) == prefix) {
          bin = static_cast<int>((k_i >> shift) & digit_mask);
          p = prob(i);
        }
      }
      HistogramAdd<true>(bin, p, s);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const auto mass = [&](int b) { return Widen(s.mass_hi[b], s.mass_lo[b]); };
      if (hi == key_bits) {  // first pass: the group is every kept key
        U128 total = 0;
        for (int b = threadIdx.x; b < (1 << width); b += 32) total += mass(b);
        total = WarpTotal(total);
        // sampling.cc: target = double(top_p) * total; a negative top_p keeps one token.
        target =
            Widen(ToFixed(fmax(__dmul_rn(static_cast<double>(top_p), FixedToDouble(total)), 0.0)));
      }
      // need >= 1: the first token (mass >= 2^83 * 1, the maximum) always qualifies.
      const U128 need = target > above ? target - above : 1;
      U128 above_here = 0;
      const int bin = SelectBinFromTop<U128>(mass, 1 << width, need, &above_here);
      above += above_here;
      if (threadIdx.x == 0) s.selected_bin = bin;
    }
    __syncthreads();
    const int bin = s.selected_bin;
    if (bin < 0) {
      __syncthreads();
      return keep_from;
    }
    prefix |= static_cast<uint64_t>(bin) << shift;
    prefix_mask |= static_cast<uint64_t>(digit_mask) << shift;
    const bool single = s.count[bin] == 1;
    __syncthreads();
    if (single) break;
  }
  return prefix;
}

// Inverse CDF over the kept tokens {K >= keep_from} in increasing id order: the first id whose
// cumulative mass exceeds threshold = u * (kept mass); the largest kept id if rounding leaves the
// threshold at the very top (sampling.cc's kept.back()). Every thread gets the id.
template <int kThreads, typename KeyFn, typename ProbFn>
__device__ int32_t InverseCdf(const KeyFn& key, const ProbFn& prob, int vocab, uint64_t keep_from,
                              double u, ChooseScratch& s) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Level 1: warp w sums the segment [w * seg, (w + 1) * seg), lanes striding (coalesced).
  const int seg = (vocab + kWarps - 1) / kWarps;
  U128 sum = 0;
  int32_t last = -1;
  {
    const int begin = min(warp * seg, vocab), end = min(begin + seg, vocab);
    for (int i = begin + lane; i < end; i += 32) {
      if (key(i) >= keep_from) {
        sum += Widen(prob(i));
        last = i;
      }
    }
  }
  sum = WarpTotal(sum);
  last = WarpMax(last);
  if (lane == 0) {
    s.warp_part[warp] = sum;
    s.warp_last[warp] = last;
  }
  if (threadIdx.x == 0) s.token = -1;
  __syncthreads();

  // Every thread derives the same total, threshold and crossing segment from the partials.
  U128 total = 0;
  int32_t last_kept = -1;
  for (int w = 0; w < kWarps; ++w) {
    total += s.warp_part[w];
    last_kept = max(last_kept, s.warp_last[w]);
  }
  const U128 threshold = Widen(ToFixed(__dmul_rn(u, FixedToDouble(total))));
  int crossing = -1;  // the segment where the cumulative mass first exceeds threshold
  U128 base = 0;      // mass of the segments before it
  for (int w = 0; w < kWarps; ++w) {
    if (base + s.warp_part[w] > threshold) {
      crossing = w;
      break;
    }
    base += s.warp_part[w];
  }
  __syncthreads();  // warp_part is reused below

  if (crossing >= 0) {
    // Level 2: thread t sums the t-th contiguous chunk of the crossing segment; a block scan
    // finds the chunk where the cumulative mass crosses; its thread walks it.
    const int begin = crossing * seg, end = min(begin + seg, vocab);
    const int chunk = (end - begin + kThreads - 1) / kThreads;
    const int chunk_begin = min(begin + static_cast<int>(threadIdx.x) * chunk, end);
    const int chunk_end = min(chunk_begin + chunk, end);
    U128 mine = 0;
    for (int i = chunk_begin; i < chunk_end; ++i) {
      if (key(i) >= keep_from) mine += Widen(prob(i));
    }
    U128 inclusive = WarpInclusiveScan(mine);
    if (lane == 31) s.warp_part[warp] = inclusive;
    __syncthreads();
    for (int w = 0; w < warp; ++w) inclusive += s.warp_part[w];
    U128 run = base + inclusive - mine;  // mass before this chunk
    if (run <= threshold && threshold < base + inclusive) {
      for (int i = chunk_begin; i < chunk_end; ++i) {
        if (key(i) >= keep_from) {
          run += Widen(prob(i));
          if (run > threshold) {
            s.token = i;
            break;
          }
        }
      }
    }
  }
  __syncthreads();
  return s.token >= 0 ? s.token : last_kept;
}

// One CTA per row; see LaunchChooseToken.
//   logits [gridDim.x, vocab], params [gridDim.x], tokens [gridDim.x]
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1)
    ChooseTokenKernel(const float* __restrict__ logits, int vocab,
                      const RowSampling* __restrict__ params, int32_t* __restrict__ tokens) {
  __shared__ ChooseScratch s;
  const int row = blockIdx.x;
  const float* __restrict__ x = logits + static_cast<int64_t>(row) * vocab;
  const RowSampling sp = params[row];
  const ArgmaxPair best = BlockArgmax<kThreads>(x, vocab);
  if (!(sp.temperature > 0.0f) || vocab == 1) {
    if (threadIdx.x == 0) tokens[row] = best.index;
    return;
  }

  // z = logit / T as sampling.cc computes it: logit * (1.0 / T) in double; the largest z is
  // that of the largest logit.
  const double inv_t = __ddiv_rn(1.0, static_cast<double>(sp.temperature));
  const double max_z = __dmul_rn(static_cast<double>(best.value), inv_t);
  const int id_bits = 32 - __clz(vocab - 1);  // vocab >= 2
  const auto key = [&](int i) {
    return (static_cast<uint64_t>(OrderedBits(x[i])) << id_bits) |
           static_cast<uint64_t>(vocab - 1 - i);
  };
  const auto prob = [&](int i) { return ProbFixed(x[i], inv_t, max_z); };

  uint64_t keep_from = 0;  // kept tokens: K >= keep_from
  if (sp.top_k > 0 && sp.top_k < vocab) {
    keep_from = TopKThreshold<kThreads>(key, vocab, 32 + id_bits, sp.top_k, s);
  }
  if (sp.top_p < 1.0f) {
    // max: the top-p threshold may sit below t_k (its bin can hold keys that top-k dropped).
    const uint64_t top_p_from =
        TopPThreshold<kThreads>(key, prob, vocab, 32 + id_bits, keep_from, sp.top_p, s);
    if (top_p_from > keep_from) keep_from = top_p_from;
  }
  const int32_t token =
      InverseCdf<kThreads>(key, prob, vocab, keep_from, UniformAt(sp.seed, sp.position), s);
  if (threadIdx.x == 0) tokens[row] = token >= 0 ? token : best.index;
}

// out[i] = UniformAt(seeds[i], positions[i]); one thread per element.
static __global__ void UniformAtKernel(const uint64_t* __restrict__ seeds,
                                       const int64_t* __restrict__ positions, int n,
                                       double* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = UniformAt(seeds[i], positions[i]);
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_CHOOSE_TOKEN_CUH_
