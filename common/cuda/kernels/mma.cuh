// Warp-level tensor-core and async-copy primitives (PTX) that sm_80 and later all have, so one
// kernel body serves sm_90a and sm_120: mma.sync m16n8k16 bf16 → fp32, ldmatrix and
// cp.async with zero fill. Fragment layouts follow the PTX ISA ("Matrix fragments for
// mma.m16n8k16"): with g = lane / 4 and c = 2 * (lane % 4),
//   A (16×16, row-major): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1], a2 = A[g][c+8..], a3 =
//   A[g+8][c+8..] B (16×8, "col"):      b0 = B[c..c+1][g],  b1 = B[c+8..c+9][g] C (16×8 fp32):
//   c0,c1 = C[g][c..c+1],  c2,c3 = C[g+8][c..c+1]
#ifndef TREESPEC_COMMON_CUDA_KERNELS_MMA_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_MMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace treespec::gpu::kernels {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8×8 bf16 matrices; lane t gives the address of row t % 8 of matrix t / 8, and register i
// receives matrix i in the fragment layout above (row g, columns c..c+1).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The same, each matrix transposed (register i holds rows c..c+1 of column g).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a · b, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to nearest even into a bf16 pair (low half = lo).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// 16 bytes global → shared, asynchronously; copies `src_bytes` (0 or 16) and zero-fills the
// rest, so a tile's rows past the end read as zeros without a branch around the copy.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_MMA_CUH_
