// Residual add fused with RMSNorm (Hugging Face LlamaRMSNorm). Launcher: rms_norm.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_RMS_NORM_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_RMS_NORM_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"

namespace treespec::gpu::kernels {

// The second pass of an RMSNorm row: with this thread's share `sum_sq` of the row's sum of
// squares, out = bf16(weight * (x * inv_rms)), inv_rms = 1 / sqrt(sum / n + eps), for the packs
// this thread owns (p = threadIdx.x, threadIdx.x + blockDim.x, ...), as in the first pass.
template <int kVec>
__device__ __forceinline__ void NormalizeRow(const __nv_bfloat16* xr,
                                             const __nv_bfloat16* __restrict__ weight, int n,
                                             float sum_sq, float eps, __nv_bfloat16* outr) {
  sum_sq = BlockSum(sum_sq);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(n) + eps);
  for (int p = threadIdx.x; p < n / kVec; p += blockDim.x) {
    Floats<kVec> v = LoadBf16<kVec>(xr + p * kVec);
    const Floats<kVec> w = LoadBf16<kVec>(weight + p * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v.v[i] = __fmul_rn(w.v[i], __fmul_rn(v.v[i], inv_rms));
    StoreBf16<kVec>(v, outr + p * kVec);
  }
}

// One block per row of n elements; thread t owns packs t, t + blockDim.x, ... in both passes,
// so every element is read and written by one thread only: out may alias x or residual.
//   pass 1: x = bf16(x + residual) (skipped without residual); sum of squares of that
//           bf16 x in fp32 (per thread, then BlockSum);
//   pass 2: out = bf16(weight * (x * inv_rms)), inv_rms = 1 / sqrt(sum / n + eps).
// The norm reads the rounded x, as a bf16 Hugging Face model does (its residual stream is
// bf16) and as an unfused add followed by a norm would.
//   x [gridDim.x, n] (in/out), residual [gridDim.x, n] or nullptr, weight [n],
//   out [gridDim.x, n]. kVec = 8 needs n % 8 == 0 and 16-byte aligned pointers.
template <int kVec>
__global__ void AddRmsNormKernel(__nv_bfloat16* x, const __nv_bfloat16* residual,
                                 const __nv_bfloat16* __restrict__ weight, int n, float eps,
                                 __nv_bfloat16* out) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * n;
  __nv_bfloat16* xr = x + row_offset;
  __nv_bfloat16* outr = out + row_offset;
  const int num_packs = n / kVec;

  float sum_sq = 0.0f;
  for (int p = threadIdx.x; p < num_packs; p += blockDim.x) {
    Floats<kVec> v = LoadBf16<kVec>(xr + p * kVec);
    if (residual != nullptr) {
      const Floats<kVec> r = LoadBf16<kVec>(residual + row_offset + p * kVec);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v.v[i] = __bfloat162float(__float2bfloat16_rn(__fadd_rn(v.v[i], r.v[i])));
      }
      StoreBf16<kVec>(v, xr + p * kVec);  // exact: v holds bf16 values
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum_sq = fmaf(v.v[i], v.v[i], sum_sq);
  }
  NormalizeRow<kVec>(xr, weight, n, sum_sq, eps, outr);
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_RMS_NORM_CUH_
