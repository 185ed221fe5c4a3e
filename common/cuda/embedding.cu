#include "common/cuda/embedding.h"
#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/embedding.cuh"
#include "common/cuda/launch_util.h"

namespace treespec::gpu {

cudaError_t LaunchEmbedding(const __nv_bfloat16* table, int vocab_begin, int vocab_rows, int hidden,
                            const int32_t* token_ids, int num_tokens, __nv_bfloat16* out,
                            cudaStream_t stream) {
  if (hidden < 1 || vocab_rows < 0 || num_tokens < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  constexpr int kMaxThreads = 256;
  if (hidden % kernels::kBf16PerPack == 0 && internal::Aligned16(table) &&
      internal::Aligned16(out)) {
    const int threads = internal::RowBlockThreads(hidden / kernels::kBf16PerPack, kMaxThreads);
    kernels::EmbeddingKernel<kernels::kBf16PerPack><<<num_tokens, threads, 0, stream>>>(
        table, vocab_begin, vocab_rows, hidden, token_ids, out);
  } else {
    const int threads = internal::RowBlockThreads(hidden, kMaxThreads);
    kernels::EmbeddingKernel<1><<<num_tokens, threads, 0, stream>>>(table, vocab_begin, vocab_rows,
                                                                    hidden, token_ids, out);
  }
  return cudaGetLastError();
}

}  // namespace treespec::gpu
