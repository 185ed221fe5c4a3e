// The RoPE cos/sin table of one token, shared by RopeKernel and KvWriteKernel.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_ROPE_TABLE_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_ROPE_TABLE_CUH_

#include <cstdint>

namespace treespec::gpu::kernels {

// The block's cos/sin table for one position, with the CPU reference's math (RopeTables in
// common/model/cpu_ops.h): table[f] = cos(angle[f]) * attention_factor, table[half + f] =
// sin(angle[f]) * attention_factor, angle[f] = fp32(float(position) * inv_freq[f]), full-range
// sincosf (not the fast intrinsic). Every thread of the block calls it; the caller syncs after.
__device__ __forceinline__ void BuildRopeTable(float* table, int half, int32_t position,
                                               const float* __restrict__ inv_freq,
                                               float attention_factor) {
  const float pos = static_cast<float>(position);
  for (int f = threadIdx.x; f < half; f += blockDim.x) {
    float s, c;
    sincosf(__fmul_rn(pos, inv_freq[f]), &s, &c);
    table[f] = __fmul_rn(c, attention_factor);
    table[half + f] = __fmul_rn(s, attention_factor);
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_ROPE_TABLE_CUH_
