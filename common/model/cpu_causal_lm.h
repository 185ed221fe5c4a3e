// The CPU reference backend of CausalLm (DESIGN §5): fp32 weights and KV, the forward pass of
// the Llama family (Llama 2/3, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k RMSNorm), tree
// attention over the paged cache, and tensor parallelism over threads (DESIGN §6).
//
// Tensor parallelism: one persistent worker thread per rank 1..tp-1 (rank 0 is the caller of
// Forward), each with its weight shard, its KvPool and an in-process Communicator; one
// all-reduce after o_proj and one after down_proj, a vocab-parallel embedding (one all-reduce)
// and a vocab-parallel LM head (all-gather of the logits). The page table is shared.
//
// Numerics: every row's logits come from a fixed sequence of fp32 operations that depends only
// on that node's token, its ancestors and the committed prefix (cpu_ops.h, tree_attention.h).
// So with the same tensor_parallel a chain prefill equals token-by-token decoding, a tree node
// equals decoding its root-to-node path, and a batch equals its sequences alone — bit for bit.
// Different tensor_parallel values sum the row-parallel matmuls in a different order and agree
// to fp32 rounding only.
//
// Forward, Commit and Truncate must be called from one thread at a time; the sequence calls
// (CreateSequence, FreeSequence, kv_cache()) are thread-safe.
#ifndef TREESPEC_COMMON_MODEL_CPU_CAUSAL_LM_H_
#define TREESPEC_COMMON_MODEL_CPU_CAUSAL_LM_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/model/weights.h"

namespace treespec {

// Builds the CPU model from full (unsharded) weights, which it takes over; for TP > 1 each rank
// copies its shard and the full weights are released. KV pool: options.kv_pages pages of
// options.kv_page_size slots, or when kv_pages == 0, max_batch * ceil(max_position_embeddings
// / kv_page_size) pages. INVALID_ARGUMENT for bad options, weight shapes that do not match the
// config, or a tensor_parallel outside [1, num_q_heads].
absl::StatusOr<std::unique_ptr<CausalLm>> CreateCpuCausalLm(const ModelConfig& config,
                                                            ModelWeights weights,
                                                            const LmOptions& options);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_CPU_CAUSAL_LM_H_
