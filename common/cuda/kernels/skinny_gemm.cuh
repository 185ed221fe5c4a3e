// The GEMM of a verify step: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) for few rows (m <= 64),
// where the time is the weight's bytes and little else:
//  - a CTA owns a tile of kRowsW = 64 rows of w (outputs) and one of `splits` equal ranges of
//    k (split-K, so that small n still fills the GPU); 8 warps: warp w takes the 16 w rows
//    16·(w % 4) and half w / 4 of every 64-column step (two of its four 16-column MMA steps),
//    and the second half's sums are added to the first's through shared memory at the end.
//    With 4 warps each doing all four, a scheduler would have 1.5 warps and the kernel would be
//    latency-bound (measured on the H200: docs/experiments/README.md, 'the 17-row step');
//  - w is the mma's A operand (16 rows of w × 16 of k) and x its B operand (8 rows of x), so a
//    single token wastes 7/8 of an 8-wide MMA instead of 15/16 of a 16-wide one;
//  - w and x stream through SkinnyStages shared-memory stages of 64 columns by cp.async (rows
//    XOR-swizzled in 16-byte chunks so ldmatrix reads are conflict-free); rows and columns past
//    the ends are zero-filled; the stages fit four CTAs per SM for every m, or, for grids of at
//    most two CTAs per SM, a deep pipeline of 96 KiB per CTA (twice the bytes in flight);
//  - with several splits, each CTA leaves an fp32 partial tile and the last CTA of the tile (a
//    per-tile counter) sums the splits in split order, then stores and re-arms the counter: one
//    launch, and the same bits whichever CTA is last;
//  - programmatic dependent launch: the first stages of w (which no earlier kernel writes) are
//    requested before griddepcontrol.wait, so they stream in while the previous kernel ends;
//    x, the partials and the counters are touched only after it.
// Gated mode (the SwiGLU MLP's gate/up projection): w is [gate rows; up rows] (n = 2f), each
// warp's 16 A rows are 8 gate rows and the 8 up rows of the same outputs (tiles of 32 outputs),
// so one thread holds both sums of an output and stores bf16(SiLU(gate) · up) [m, f] straight
// from fp32.
// The split depends on n and k only (never on m), so each row's sum runs in the same order
// whatever the other rows are (batch invariance, DESIGN §3).
#ifndef TREESPEC_COMMON_CUDA_KERNELS_SKINNY_GEMM_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_SKINNY_GEMM_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/mma.cuh"

namespace treespec::gpu::kernels {

inline constexpr int kSkinnyThreads = 256;  // 8 warps: 4 row groups × 2 halves of k
inline constexpr int kSkinnyRowsW = 64;     // w rows (outputs) per tile: 16 per warp
inline constexpr int kSkinnyStepK = 64;     // k columns per step: 128-byte rows, 8 chunks
inline constexpr int kSkinnyMaxTok = 8;     // tiles of 8 x rows: m <= 64

// Pipeline stages: as many as fit a quarter of an SM's shared memory with the x tile of kTok
// tiles (kTok 1, 2, 3, 4, 8: 40, 32, 32, 24 or 16 KB of w in flight per CTA), so four CTAs of
// any m share an SM. kTok = 3 exists for the 17-row step (16 drafted nodes + the root): padded
// to 32 rows it would keep only 24 KB in flight.
template <int kTok>
__host__ __device__ constexpr int SkinnyStages() {
  return kTok == 1 ? 6 : kTok <= 3 ? 5 : kTok == 4 ? 4 : 3;
}

// The deep pipeline, for grids too small to fill four CTAs per SM (the QKV and output
// projections: 192–256 CTAs on 132 SMs): as many stages as fit 96 KiB (what sm_120 allows a
// block, and two CTAs per SM on sm_90), so each CTA keeps about twice the weight bytes in
// flight.
inline constexpr int kSkinnyDeepBytes = 96 * 1024;
template <int kTok>
__host__ __device__ constexpr int SkinnyDeepStages() {
  return kSkinnyDeepBytes / ((kSkinnyRowsW + kTok * 8) * kSkinnyStepK * 2);
}

struct SkinnyGemmArgs {
  const __nv_bfloat16* x;     // [m, k]
  const __nv_bfloat16* w;     // [n, k]
  const __nv_bfloat16* bias;  // [n] or null
  __nv_bfloat16* y_bf16;      // [m, n], or null
  float* y_f32;               // [m, n], or null
  int m, n, k;
  int tiles, k_steps;  // gridDim.x = ceil(n / 64) (gated: ceil(n / 2 / 32)); ceil(k / 64)
  int splits;          // gridDim.y
  float* partials;     // splits > 1: [splits, tiles, kSkinnyRowsW, kTok * 8]
  int* counters;       // splits > 1: [tiles], zero between launches
};

// Shared bytes of a CTA with kTok tiles of 8 x rows and kStages stages.
template <int kTok, int kStages>
__host__ __device__ constexpr int SkinnySharedBytes() {
  return kStages * (kSkinnyRowsW + kTok * 8) * kSkinnyStepK * 2;
}

// Offset in bytes of 16-byte chunk `chunk` of tile row `row` (128-byte rows, XOR-swizzled).
__device__ __forceinline__ uint32_t SwizzledChunk(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The row of the row-major [rows, k] matrix that stage row r holds: row0 + r, or, gated
// (kGated, w of [gate rows; up rows], half = rows / 2 each), gate row row0 + 8·(r / 16) + r % 8
// for r % 16 < 8 and the up row of the same output otherwise. -1 past the end.
template <bool kGated>
__device__ __forceinline__ int StageRow(int r, int row0, int rows) {
  if constexpr (kGated) {
    const int half = rows >> 1;
    const int out = row0 + ((r >> 4) << 3) + (r & 7);
    return out < half ? out + ((r & 8) != 0 ? half : 0) : -1;
  } else {
    return row0 + r < rows ? row0 + r : -1;
  }
}

// v, through an instruction the compiler cannot see into: a value worked out once before a loop
// then stays in its register, instead of being recomputed from the thread index in every
// iteration (which ptxas prefers when it has registers to save).
__device__ __forceinline__ uint32_t Opaque(uint32_t v) {
  uint32_t r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
template <typename T>
__device__ __forceinline__ const T* Opaque(const T* p) {
  uint64_t r;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(r) : "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<const T*>(r);
}

// A thread's share of copying one stage (columns [kt·64, kt·64 + 64) of kRows rows of the
// row-major [rows, k] matrix `src`, StageRow's rows) into shared memory, with everything that
// does not depend on kt worked out once: a thread always copies the same chunk column of the
// same rows, so a stage costs it one add, one compare and one cp.async per chunk. Rows past the
// end and columns >= k are zero-filled. (The 24-row kernel is issue-latency-bound per warp: with
// the addressing recomputed per stage, its main loop would be 135 instructions per stage around
// its 6 ldmatrix and 6 mma instead of 62; docs/experiments/README.md, 'the few-row GEMM's
// addressing worked out once'.)
template <int kRows, bool kGated = false>
struct StageCopier {
  static constexpr int kChunks = kRows * 8;
  static constexpr int kIters = (kChunks + kSkinnyThreads - 1) / kSkinnyThreads;
  const __nv_bfloat16* from[kIters];  // this thread's rows at its chunk of step 0
  uint32_t to[kIters];                // its chunks' offsets in a stage
  bool row_ok[kIters], active[kIters];
  int col;  // its chunk's first column within a step

  __device__ __forceinline__ StageCopier(const __nv_bfloat16* src, int row0, int limit_rows,
                                         int k) {
    col = (threadIdx.x & 7) * 8;  // kSkinnyThreads is a multiple of 8: the same chunk always
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = threadIdx.x + it * kSkinnyThreads;
      const int row = i >> 3;
      const int grow = StageRow<kGated>(row, row0, limit_rows);
      active[it] = kChunks % kSkinnyThreads == 0 || i < kChunks;
      row_ok[it] = grow >= 0;
      from[it] = Opaque(row_ok[it] ? src + static_cast<int64_t>(grow) * k + col : src);
      to[it] = Opaque(SwizzledChunk(row, threadIdx.x & 7));
    }
  }
  __device__ __forceinline__ void Copy(uint32_t stage, int kt, int k) const {
    const int offset = kt * kSkinnyStepK;
    const bool col_ok = offset + col < k;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (!active[it]) break;
      const bool valid = row_ok[it] && col_ok;
      CpAsync16(stage + to[it], valid ? from[it] + offset : from[it], valid ? 16 : 0);
    }
  }
};

__device__ __forceinline__ void LdMatrixX2(uint32_t& r0, uint32_t& r1, uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(address));
}

template <int kTok, bool kGated, int kStages>
__global__ void __launch_bounds__(kSkinnyThreads) SkinnyGemmKernel(const SkinnyGemmArgs a) {
  static_assert(kStages >= 3, "the pipeline needs three stages");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kWBytes = kSkinnyRowsW * 128, kXBytes = kTok * 8 * 128, kTokRows = kTok * 8;
  const uint32_t w_base = SharedAddress(smem);
  const uint32_t x_base = w_base + kStages * kWBytes;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int kt0 = static_cast<int>(static_cast<int64_t>(split) * a.k_steps / a.splits);
  const int iters = static_cast<int>(static_cast<int64_t>(split + 1) * a.k_steps / a.splits) - kt0;
  const int w_row0 = tile * (kGated ? kSkinnyRowsW / 2 : kSkinnyRowsW);
  const StageCopier<kSkinnyRowsW, kGated> w_copier(a.w, w_row0, a.n, a.k);
  const StageCopier<kTokRows> x_copier(a.x, 0, a.m, a.k);
  auto load = [&](int slot, int kt, bool with_w, bool with_x) {
    if (with_w) w_copier.Copy(w_base + slot * kWBytes, kt, a.k);
    if (with_x) x_copier.Copy(x_base + slot * kXBytes, kt, a.k);
  };

  // Prologue: w of the first kStages - 1 steps (one group), then, once the previous kernel is
  // done, x of each of them (a group each): step i is in when all but kStages - 2 groups are.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < iters) load(s, kt0 + s, true, false);
  }
  CpAsyncCommit();
  WaitForPriorGrid();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < iters) load(s, kt0 + s, false, true);
    CpAsyncCommit();
  }

  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int khalf = threadIdx.x >> 7;  // which two of a step's four 16-column MMA steps
  // acc[t]: c0, c1 = (w row g, x rows 8t + c, c + 1), c2, c3 = (w row g + 8, same x rows).
  const int g = lane >> 2, c = 2 * (lane & 3);
  const int local0 = warp * 16 + g;  // tile rows local0 and local0 + 8
  float acc[kTok][4] = {};

  // Stores the tile from acc: + bias, or, gated, SiLU(gate) · up.
  auto store = [&]() {
    if constexpr (kGated) {
      // c0, c1: gate sums of output column tile·32 + 8·warp + g for x rows c, c + 1 of each
      // 8-row tile; c2, c3: the up sums of the same outputs.
      const int f = a.n >> 1;
      const int col = tile * (kSkinnyRowsW / 2) + warp * 8 + g;
      if (col >= f) return;
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = t * 8 + c + e;
          if (row < a.m) {
            a.y_bf16[static_cast<int64_t>(row) * f + col] =
                __float2bfloat16_rn(SiluTimes(acc[t][e], acc[t][2 + e]));
          }
        }
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = tile * kSkinnyRowsW + local0 + 8 * h;
        if (col >= a.n) continue;
        const float b = a.bias != nullptr ? __bfloat162float(a.bias[col]) : 0.0f;
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int row = t * 8 + c + e;
            if (row >= a.m) continue;
            const float v = acc[t][2 * h + e] + b;
            const int64_t at = static_cast<int64_t>(row) * a.n + col;
            if (a.y_f32 != nullptr) {
              a.y_f32[at] = v;
            } else {
              a.y_bf16[at] = __float2bfloat16_rn(v);
            }
          }
        }
      }
    }
  };
  auto partial = [&](int part, int h, int t) {
    return a.partials +
           ((static_cast<int64_t>(part) * a.tiles + tile) * kSkinnyRowsW + local0 + 8 * h) *
               kTokRows +
           t * 8 + c;
  };
  // acc (of the first half's threads) holds this CTA's share of the tile: store it, or leave a
  // partial and let the last CTA of the tile sum the splits in order. Every thread of the CTA
  // calls it; only the first half's threads touch data.
  auto finish = [&]() {
    if (a.splits == 1) {
      if (khalf == 0) store();
      return;
    }
    if (khalf == 0) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<float2*>(partial(split, h, t)) =
              make_float2(acc[t][2 * h], acc[t][2 * h + 1]);
        }
      }
    }
    // The last CTA sums in split order (its own share from its registers: the same bits).
    if (!ArriveIsLast(a.counters + tile, a.splits) || khalf != 0) return;
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 sum = make_float2(0.0f, 0.0f);
        for (int p = 0; p < a.splits; ++p) {
          const float2 part = p == split
                                  ? make_float2(acc[t][2 * h], acc[t][2 * h + 1])
                                  : __ldcg(reinterpret_cast<const float2*>(partial(p, h, t)));
          sum.x = p == 0 ? part.x : sum.x + part.x;
          sum.y = p == 0 ? part.y : sum.y + part.y;
        }
        acc[t][2 * h] = sum.x;
        acc[t][2 * h + 1] = sum.y;
      }
    }
    store();
    if (threadIdx.x == 0) a.counters[tile] = 0;  // re-armed for the next launch
  };

  // This thread's ldmatrix offsets within a stage, for its two 16-column MMA steps kk =
  // 2·khalf + h. A: w rows 16·warp + [0, 16), k chunks 2kk, 2kk + 1: matrix j = lane / 8 holds
  // rows 8·(j & 1) + lane % 8 of chunk 2kk + j / 2. B of x rows 8t + [0, 16) (t even): matrix j
  // holds rows 8(t + j / 2) + lane % 8 of chunk 2kk + j % 2; a last odd tile alone: chunks 2kk
  // (b0) and 2kk + 1 (b1) of rows 8t + lane % 8.
  const int j = lane >> 3;
  uint32_t a_at[2], b_at[2][kTok / 2 > 0 ? kTok / 2 : 1], odd_at[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int kk = 2 * khalf + h;
    a_at[h] = Opaque(SwizzledChunk(warp * 16 + (lane & 7) + (j & 1) * 8, kk * 2 + (j >> 1)));
#pragma unroll
    for (int t = 0; t + 1 < kTok; t += 2) {
      b_at[h][t / 2] = Opaque(SwizzledChunk((t + (j >> 1)) * 8 + (lane & 7), kk * 2 + (j & 1)));
    }
    odd_at[h] = Opaque(SwizzledChunk((kTok - 1) * 8 + (lane & 7), kk * 2 + (j & 1)));
  }

  int slot = 0, load_slot = kStages - 1;
  for (int i = 0; i < iters; ++i) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // step i is visible to all; the slot of step i - 1 is free
    if (i + kStages - 1 < iters) load(load_slot, kt0 + i + kStages - 1, true, true);
    CpAsyncCommit();
    load_slot = load_slot + 1 == kStages ? 0 : load_slot + 1;

    const uint32_t ws = w_base + slot * kWBytes, xs = x_base + slot * kXBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t af[4];
      LdMatrixX4(af, ws + a_at[h]);
#pragma unroll
      for (int t = 0; t + 1 < kTok; t += 2) {
        uint32_t b[4];
        LdMatrixX4(b, xs + b_at[h][t / 2]);
        MmaBf16(acc[t], af, b[0], b[1]);
        MmaBf16(acc[t + 1], af, b[2], b[3]);
      }
      if constexpr (kTok % 2 == 1) {
        uint32_t b0, b1;
        LdMatrixX2(b0, b1, xs + odd_at[h]);
        MmaBf16(acc[kTok - 1], af, b0, b1);
      }
    }

    slot = slot + 1 == kStages ? 0 : slot + 1;
  }
  CpAsyncWait<0>();
  // The second half's sums onto the first's (the stages are free once every copy has landed).
  __syncthreads();
  float* const halves = reinterpret_cast<float*>(smem);  // [128 threads][kTok * 4]
  if (khalf == 1) {
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) halves[(t * 4 + e) * 128 + (threadIdx.x & 127)] = acc[t][e];
    }
  }
  __syncthreads();
  if (khalf == 0) {
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] += halves[(t * 4 + e) * 128 + threadIdx.x];
    }
  }
  finish();
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_SKINNY_GEMM_CUH_
