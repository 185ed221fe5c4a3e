// Cuts a rank's weights out of the full model (DESIGN §6). The rule is the tensor slot's kind
// (weights.h: SlotKind), so a new tensor states how it is cut where it is listed:
//
//   column-parallel (rows of [out, in]):  kQHeads, kKvHeads (q/k/v_proj and biases; MLA's
//                                         q_proj or q_b_proj and kv_b_proj), kMlpOut
//                                         (gate_proj, up_proj of the dense MLP, of every
//                                         routed expert and of the shared experts)
//   row-parallel (columns of [out, in]):  kQHeadsIn (o_proj), kMlpIn (down_proj)
//   vocab-parallel (rows):                kVocab (embed_tokens, lm_head; tied: the embed slice
//                                         serves)
//   replicated:                           kNorm (every RMSNorm weight) and kWhole (the context
//                                         projection's fc: every rank projects the K/V of its
//                                         heads from the whole context row; MLA's latent
//                                         projections q_a_proj and kv_a_proj_with_mqa; the MoE
//                                         router and its score bias)
//
// MLA: each rank computes the whole latent (c_kv, k_rope) of every token and caches it, rather
// than splitting the projection and all-gathering it: the latent is 576 values per token for
// DeepSeek-V3, its projection (hidden × 576) a few percent of a layer's weights, and a
// collective per layer costs more on a latency-bound verify step than the duplicated work.
// MoE: every expert is cut by intermediate columns on every rank (as the dense MLP) rather
// than placed whole on one rank (expert parallel): a verify step routes a few hundred rows, so
// per-rank load stays balanced whatever the router picks, no all-to-all is needed, and one
// all-reduce after the MLP serves dense and MoE layers alike.
#ifndef TREESPEC_COMMON_MODEL_TP_SHARD_H_
#define TREESPEC_COMMON_MODEL_TP_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"
#include "common/model/tp_plan.h"
#include "common/model/weights.h"

namespace treespec {

// How a rank's part of one tensor is cut from the full [out, in] (or [n]) tensor.
struct TpSlice {
  enum class Axis { kAll, kRows, kColumns };
  Axis axis = Axis::kAll;
  int64_t begin = 0, end = 0;  // rows or columns [begin, end); unused for kAll
};

// The slicing rule above for a tensor of `kind` and full `shape` ([out, in] or [n]) on the rank
// `rank`; the single rule table the CPU shards here and the CUDA backend slices on the device
// with. Head slots are cut in whole heads of the width the shape implies (out or in / heads),
// MLP slots by TpRankPlan::MlpColumns of their own width.
TpSlice TpSliceOf(const ModelConfig& config, SlotKind kind, absl::Span<const int64_t> shape,
                  const TpRankPlan& rank);

// Copies rank `rank`'s slices of `full` (shapes as ForEachTensor says for `config`). The
// result has the layout of ModelWeights with the rank's sizes, e.g. wq [rank q heads *
// head_dim, hidden], embed [rank vocab rows, hidden]. Errors name the tensor.
absl::StatusOr<ModelWeights> ShardWeights(const ModelConfig& config, const ModelWeights& full,
                                          const TpPlan& plan, int rank);

// Checks every tensor ForEachTensor lists for `config`: present ones have their full shape,
// absent ones are empty. The message names the tensor and both shapes.
absl::Status ValidateWeightShapes(const ModelConfig& config, const ModelWeights& weights);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_TP_SHARD_H_
