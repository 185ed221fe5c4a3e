// One-shot all-reduce over peer GPUs (NVLink P2P loads) fused with the residual add and
// RMSNorm that follow it in a tensor-parallel layer. Launcher: peer_all_reduce.{h,cu}.
//
// Each rank's previous kernel (a row-parallel GEMM) wrote its partial sums into its own
// mailbox. Block b of every rank first meets block b of every other rank at a flag barrier
// (system-scope release/acquire on 64-bit epochs that only grow), which proves that every
// rank's partials are written; then it reads the rows it owns from every rank's mailbox, sums
// them in rank order in fp32 (so every rank gets the same bits) and does what AddRmsNormKernel
// does with that sum as the residual. Double-buffered mailboxes make one barrier per call
// enough: a rank writes a mailbox again two calls later, after every peer has entered the call
// in between and so has finished reading this one.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_PEER_ALL_REDUCE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_PEER_ALL_REDUCE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/rms_norm.cuh"

namespace treespec::gpu::kernels {

inline constexpr int kPeerMaxRanks = 8;
inline constexpr int kPeerMaxBlocks = 128;  // few enough to be resident together on any GPU

struct PeerReduceArgs {
  const __nv_bfloat16* partial[kPeerMaxRanks];  // every rank's mailbox of this call
  uint64_t* flags[kPeerMaxRanks];  // every rank's flags [kPeerMaxBlocks][kPeerMaxRanks]
  int ranks;
  int rank;
  uint64_t epoch;       // this call's number, the same on every rank, > every earlier one
  uint64_t timeout_ns;  // a block that waits longer traps (a peer that never came)
};

__device__ __forceinline__ void StoreRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread q < ranks signals rank q and waits for rank q; the block then proceeds together.
__device__ __forceinline__ void PeerBarrier(const PeerReduceArgs& a) {
  const int q = threadIdx.x;
  if (q < a.ranks) {
    const int slot = blockIdx.x * kPeerMaxRanks;
    StoreRelease(a.flags[q] + slot + a.rank, a.epoch);
    const uint64_t* mine = a.flags[a.rank] + slot + q;
    const uint64_t start = GlobalTimerNs();
    while (LoadAcquire(mine) < a.epoch) {
      if (GlobalTimerNs() - start > a.timeout_ns) __trap();
    }
  }
  __syncthreads();
}

// For rows r = blockIdx.x, blockIdx.x + gridDim.x, ... of n elements:
//   s = bf16(sum over ranks q in order of partial[q][r, :])
//   x[r, :] = bf16(x[r, :] + s), or s when !add_residual
//   out[r, :] = bf16(weight * (x / sqrt(mean(x²) + eps)))        (as AddRmsNormKernel)
template <int kVec>
__global__ void PeerAllReduceRmsNormKernel(PeerReduceArgs a, int rows, __nv_bfloat16* x,
                                           bool add_residual,
                                           const __nv_bfloat16* __restrict__ weight, int n,
                                           float eps, __nv_bfloat16* out) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  PeerBarrier(a);
  const int num_packs = n / kVec;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t row_offset = static_cast<int64_t>(row) * n;
    __nv_bfloat16* xr = x + row_offset;
    float sum_sq = 0.0f;
    for (int p = threadIdx.x; p < num_packs; p += blockDim.x) {
      Floats<kVec> s;
#pragma unroll
      for (int i = 0; i < kVec; ++i) s.v[i] = 0.0f;
      for (int q = 0; q < a.ranks; ++q) {
        // L2-only loads: a peer's mailbox changes between calls, L1 must not keep it.
        const Floats<kVec> part = LoadBf16<kVec, true>(a.partial[q] + row_offset + p * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) s.v[i] = __fadd_rn(s.v[i], part.v[i]);
      }
      Floats<kVec> v;
      if (add_residual) v = LoadBf16<kVec>(xr + p * kVec);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float sum = __bfloat162float(__float2bfloat16_rn(s.v[i]));
        v.v[i] = add_residual ? __bfloat162float(__float2bfloat16_rn(__fadd_rn(v.v[i], sum))) : sum;
      }
      StoreBf16<kVec>(v, xr + p * kVec);  // exact: v holds bf16 values
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum_sq = fmaf(v.v[i], v.v[i], sum_sq);
    }
    NormalizeRow<kVec>(xr, weight, n, sum_sq, eps, out + row_offset);
    __syncthreads();  // BlockSum's shared memory is reused by the next row
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_PEER_ALL_REDUCE_CUH_
