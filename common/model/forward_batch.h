// The backend-independent half of CausalLm::Forward: checking a batch and reserving its slots.
// Shared by the CPU and CUDA backends so both refuse exactly the same batches.
#ifndef TREESPEC_COMMON_MODEL_FORWARD_BATCH_H_
#define TREESPEC_COMMON_MODEL_FORWARD_BATCH_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"

namespace treespec {

// INVALID_ARGUMENT naming the batch entry and field for: a sequence twice or unknown, an empty
// tree, tokens/parents of different lengths, a token outside [0, vocab), a parent outside
// [-1, i), first_new outside [0, n], committed_len + first_new beyond the reserved slots, or
// committed_len + n beyond the model's context, and a bidirectional tree that is not a chain
// or has first_new > 0.
absl::Status ValidateForwardBatch(const ModelConfig& config, PagedKvCache& cache,
                                  absl::Span<const SeqTree> batch);

// CausalLm::AppendContext's checks (its errors), then reserves slots [0, committed_len +
// rows.rows) of every entry's sequence, all or nothing (as ReserveForwardBatch).
absl::Status ReserveContextRows(const ModelConfig& config, PagedKvCache& cache,
                                absl::Span<const ContextRows> batch);

// Reserves slots [0, L + n) of every sequence, all or nothing (RESOURCE_EXHAUSTED when the
// pool runs out; the sequences reserved so far are truncated back).
absl::Status ReserveForwardBatch(PagedKvCache& cache, absl::Span<const SeqTree> batch);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_FORWARD_BATCH_H_
