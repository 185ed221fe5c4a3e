// Device helpers shared by the kernels in this folder: 16-byte bf16 packs and a block-wide sum.
// Plain CUDA C++ that compiles for every architecture we build (sm_90a, sm_120).
#ifndef TREESPEC_COMMON_CUDA_KERNELS_COMMON_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_COMMON_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace treespec::gpu::kernels {

// Elements per 16-byte access: kernels templated on kVec run either kVec = 8 (one uint4 per
// access, when the row length and the pointers allow it) or kVec = 1 (scalar fallback).
inline constexpr int kBf16PerPack = 8;

// kVec consecutive bf16 values held as fp32.
template <int kVec>
struct Floats {
  float v[kVec];
};

// kL2Only: an L2-only load (ld.global.cg), for memory another GPU or kernel rewrites between
// reads that L1 must not keep (a peer's all-reduce mailbox).
template <int kVec, bool kL2Only = false>
__device__ __forceinline__ Floats<kVec> LoadBf16(const __nv_bfloat16* p) {
  Floats<kVec> f;
  if constexpr (kVec == 8) {
    const uint4 raw =
        kL2Only ? __ldcg(reinterpret_cast<const uint4*>(p)) : *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 two = __bfloat1622float2(pairs[i]);
      f.v[2 * i] = two.x;
      f.v[2 * i + 1] = two.y;
    }
  } else {
    static_assert(kVec == 1, "kVec is 8 or 1");
    const unsigned short bits = kL2Only ? __ldcg(reinterpret_cast<const unsigned short*>(p))
                                        : *reinterpret_cast<const unsigned short*>(p);
    f.v[0] = __bfloat162float(__ushort_as_bfloat16(bits));
  }
  return f;
}

// Rounds to nearest even (as PyTorch and dtype.h's FloatToBf16Bits do) and stores.
template <int kVec>
__device__ __forceinline__ void StoreBf16(const Floats<kVec>& f, __nv_bfloat16* p) {
  if constexpr (kVec == 8) {
    uint4 raw;
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(f.v[2 * i], f.v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    static_assert(kVec == 1, "kVec is 8 or 1");
    *p = __float2bfloat16_rn(f.v[0]);
  }
}

// Programmatic dependent launch (sm_90 and later). A kernel launched as a programmatic
// dependent of the stream's previous kernel (the few-row GEMM, skinny_gemm.h) may start once
// every CTA of that kernel has called AllowDependentLaunch (or exited), and must call
// WaitForPriorGrid before it touches anything the previous kernels write: that waits for their
// completion and their memory. Both are no-ops for launches without the attribute.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Split work whose last CTA finishes it (the few-row GEMM's split-K sum): every thread of the CTA
// calls this after its global writes of the CTA's share; the CTA counts itself in on `counter` and
// every thread learns whether it was the last of `arrivals`. The barrier, then one release-acquire
// atomic by thread 0, publishes the whole CTA's writes (a gpu-scope release is cumulative over what
// the barrier ordered before it) and, in the last CTA, makes the other CTAs' writes visible to
// every thread after the second barrier: one fence on one thread instead of a sequentially
// consistent fence on every thread before and after. Also a barrier for shared memory: every warp
// is past its earlier uses of it.
__device__ __forceinline__ bool ArriveIsLast(int* counter, int arrivals) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(before)
                 : "l"(counter)
                 : "memory");
    last = before == arrivals - 1;
  }
  __syncthreads();
  return last != 0;
}

// silu(g) · u = g / (1 + exp(-g)) · u in fp32 with the full-precision expf: the arithmetic of
// the CPU reference (SiluMul in cpu_ops.h), for every kernel that gates the MLP.
__device__ __forceinline__ float SiluTimes(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Sum over a warp by butterfly shuffles; every lane gets the total.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of `v` over the block; every thread gets the total. blockDim.x must be a multiple of 32
// (full warps for the shuffles). The order of additions depends only on blockDim.x, so a
// row's result does not depend on other rows (batch invariance, DESIGN §3). Call at most once
// per kernel (it reuses its shared memory without a trailing barrier).
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / 32;
    v = WarpSum(lane < num_warps ? warp_sums[lane] : 0.0f);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_COMMON_CUH_
