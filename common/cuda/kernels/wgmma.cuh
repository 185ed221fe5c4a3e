// Warpgroup matrix multiply (wgmma, sm_90a only) for the tree attention's wgmma path
// (kernels/tree_attention.cuh): shared-memory matrix descriptors for 128-byte-swizzled tiles, the
// two instruction shapes the kernel uses, and the fences around them. Built for other
// architectures (sm_120), every function here traps: the host selects the wgmma path only on
// compute capability 9.0 (tree_attention.cu).
//
// Shared-memory layout the descriptors describe (PTX ISA, "Shared Memory Matrix Layout", 128B
// swizzle): rows of 64 bf16 (128 bytes) whose 16-byte chunks are XOR-swizzled by (row % 8),
// groups of 8 rows 1024 bytes apart, every group 1024-byte aligned. A [rows, 128] tile is two
// such [rows, 64] halves one after the other (GmmaTileOffset).
//  - K-major operand (A = Q and B = K of S = Q·Kᵀ: the reduced dimension is contiguous): stride
//    between 8-row groups (SBO) 1024 bytes; a k16 step moves the start address 32 bytes along
//    the row, and k >= 64 is the second half.
//  - N-major operand (B = V of O += P·V: the output columns are contiguous): SBO = 1024 bytes
//    between groups of 8 keys, LBO = the distance between the two 64-column halves; a k16 step
//    (16 keys) moves the start address 2048 bytes.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_WGMMA_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_WGMMA_CUH_

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TREESPEC_HAS_WGMMA 1
#else
#define TREESPEC_HAS_WGMMA 0
#endif

namespace treespec::gpu::kernels {

// Element offset of 16-byte chunk `chunk` (of 8 bf16) of row `row` in a [rows, 64 · halves]
// tile stored as 128-byte-swizzled halves of `rows` rows each.
template <int kRowsTotal>
__host__ __device__ constexpr int GmmaTileOffset(int row, int chunk) {
  return (chunk / 8) * kRowsTotal * 64 + row * 64 + ((chunk % 8) ^ (row % 8)) * 8;
}

// The 64-bit shared-memory matrix descriptor: start address, leading and stride byte offsets
// (16-byte units), 128-byte swizzle, base offset 0 (the tile's 8-row groups are 1024-byte
// aligned).
__device__ __forceinline__ uint64_t GmmaDescriptor(uint32_t smem_address, uint32_t lbo_bytes,
                                                   uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// desc with its start address moved by byte_offset (a multiple of 16): one add to the low word,
// which cannot carry into the leading byte offset since shared addresses are below 256 KiB. Base
// descriptors worked out once and moved per stage and k step cost an instruction each, where
// GmmaDescriptor from an address costs four (mask, shift, or, and the constant high word).
__device__ __forceinline__ uint64_t GmmaDescriptorPlus(uint64_t desc, uint32_t byte_offset) {
  return (desc & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(desc) + (byte_offset >> 4));
}

__device__ __forceinline__ void WgmmaUnavailable() {
#if defined(__CUDA_ARCH__)
  __trap();
#endif
}

// Before a wgmma that reads registers (accumulators, A fragments) other instructions wrote.
__device__ __forceinline__ void WgmmaFence() {
#if TREESPEC_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if TREESPEC_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if TREESPEC_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous wgmma (call on each after WgmmaWait, and before WgmmaFence).
template <int kN>
__device__ __forceinline__ void WgmmaPinRegisters(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared memory written by ordinary stores or cp.async, made visible to wgmma's reads (the
// async proxy); each writing thread calls it before the barrier that publishes the data.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if TREESPEC_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d[32] (+)= A · B for one warpgroup: m64n64k16, A (64 × 16) and B (16 × 64, K-major) in shared
// memory by descriptor; accumulate = 0 overwrites d.
__device__ __forceinline__ void WgmmaM64N64K16SS(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
#if TREESPEC_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
  WgmmaUnavailable();
#endif
}

// d[32] (+)= A · B for one warpgroup: m64n64k16, A (64 × 16 bf16) from registers in the
// mma.sync A-fragment layout (per warp, its 16 rows), B (16 × 64) N-major in shared memory by
// descriptor.
__device__ __forceinline__ void WgmmaM64N64K16RS(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t desc_b, int accumulate) {
#if TREESPEC_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
  WgmmaUnavailable();
#endif
}

// d[64] (+)= A · B for one warpgroup: m64n128k16, A (64 × 16 bf16) from registers in the
// mma.sync A-fragment layout (per warp, its 16 rows), B (16 × 128) N-major in shared memory by
// descriptor.
__device__ __forceinline__ void WgmmaM64N128K16RS(float (&d)[64], const uint32_t (&a)[4],
                                                  uint64_t desc_b, int accumulate) {
#if TREESPEC_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
  WgmmaUnavailable();
#endif
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_WGMMA_CUH_
