// SwiGLU gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Launcher: silu_mul.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_SILU_MUL_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_SILU_MUL_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/kernels/common.cuh"

namespace treespec::gpu::kernels {

// Grid-stride over packs of kVec elements; a pack never crosses a row (kVec divides cols).
// Same arithmetic as the CPU reference (SiluMul in cpu_ops.h), in fp32 with the full-precision
// expf, rounded once to bf16.
//   gate, up [rows, in_stride] (the first cols of each row are read), out [rows, cols].
//   kVec = 8 needs cols % 8 == 0, in_stride % 8 == 0 and 16-byte aligned pointers.
template <int kVec>
__global__ void SiluMulKernel(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                              int rows, int cols, __nv_bfloat16* out) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  const int packs_per_row = cols / kVec;
  const int64_t num_packs = static_cast<int64_t>(rows) * packs_per_row;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < num_packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p / packs_per_row;
    const int col = static_cast<int>(p - row * packs_per_row) * kVec;
    const Floats<kVec> g = LoadBf16<kVec>(gate + row * in_stride + col);
    const Floats<kVec> u = LoadBf16<kVec>(up + row * in_stride + col);
    Floats<kVec> o;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      o.v[i] = SiluTimes(g.v[i], u.v[i]);
    }
    StoreBf16<kVec>(o, out + row * cols + col);
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_SILU_MUL_CUH_
