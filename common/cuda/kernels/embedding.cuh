// Embedding lookup: out[i, :] = table[token_ids[i] - vocab_begin, :], or zeros when the id is
// outside this table's slice of the vocabulary. Launcher: embedding.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_EMBEDDING_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_EMBEDDING_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/kernels/common.cuh"

namespace treespec::gpu::kernels {

// One block per token. A pure copy, so it moves raw bits: uint4 (8 bf16) per access when
// kVec = 8 (hidden % 8 == 0 and both pointers 16-byte aligned), uint16_t otherwise.
//   table [vocab_rows, hidden], token_ids [gridDim.x], out [gridDim.x, hidden].
template <int kVec>
__global__ void EmbeddingKernel(const __nv_bfloat16* __restrict__ table, int vocab_begin,
                                int vocab_rows, int hidden, const int32_t* __restrict__ token_ids,
                                __nv_bfloat16* __restrict__ out) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  using Pack = std::conditional_t<kVec == 8, uint4, uint16_t>;
  const int row = blockIdx.x;
  const int64_t local = static_cast<int64_t>(token_ids[row]) - vocab_begin;
  const bool in_slice = local >= 0 && local < vocab_rows;
  const Pack* src = reinterpret_cast<const Pack*>(table + (in_slice ? local : 0) * hidden);
  Pack* dst = reinterpret_cast<Pack*>(out + static_cast<int64_t>(row) * hidden);
  const int num_packs = hidden / kVec;
  for (int p = threadIdx.x; p < num_packs; p += blockDim.x) {
    dst[p] = in_slice ? src[p] : Pack{};
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_EMBEDDING_CUH_
