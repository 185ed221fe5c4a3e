// Embedding lookup on the GPU (bf16). Kernel: kernels/embedding.cuh; CPU reference: the row
// copy in CpuCausalLm::Embed (common/model/cpu_causal_lm.cc).
#ifndef TREESPEC_COMMON_CUDA_EMBEDDING_H_
#define TREESPEC_COMMON_CUDA_EMBEDDING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// out[i, :] = table[token_ids[i] - vocab_begin, :] for ids in [vocab_begin, vocab_begin +
// vocab_rows), zeros for any other id. The table may be one tensor-parallel rank's slice of
// the vocabulary: the zero rows make the all-reduce over ranks exact, as on the CPU path. Ids
// are not validated here (the engine rejects out-of-vocabulary ids on the host); an invalid one
// only yields a zero row, never an out-of-bounds read.
//   table      [vocab_rows, hidden] bf16, device
//   token_ids  [num_tokens] int32, device
//   out        [num_tokens, hidden] bf16, device; must not overlap table
// Returns cudaErrorInvalidValue for hidden < 1, vocab_rows < 0 or num_tokens < 0 (nothing
// launched); cudaSuccess without a launch for num_tokens == 0; else the launch's error.
cudaError_t LaunchEmbedding(const __nv_bfloat16* table, int vocab_begin, int vocab_rows, int hidden,
                            const int32_t* token_ids, int num_tokens, __nv_bfloat16* out,
                            cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_EMBEDDING_H_
