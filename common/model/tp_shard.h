// Cuts a rank's weights out of the full model (DESIGN §6). The rule is the tensor slot's kind
// (weights.h: SlotKind), so a new tensor states how it is cut where it is listed:
//
//   column-parallel (rows of [out, in]):  kQHeads, kKvHeads (q/k/v_proj and biases), kMlpOut
//                                         (gate_proj, up_proj)
//   row-parallel (columns of [out, in]):  kQHeadsIn (o_proj), kMlpIn (down_proj)
//   vocab-parallel (rows):                kVocab (embed_tokens, lm_head; tied: the embed slice
//                                         serves)
//   replicated:                           kNorm (every RMSNorm weight) and kWhole (the context
//                                         projection's fc: every rank projects the K/V of its
//                                         heads from the whole context row)
#ifndef TREESPEC_COMMON_MODEL_TP_SHARD_H_
#define TREESPEC_COMMON_MODEL_TP_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
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

// The slicing rule above for a tensor of `kind` on the rank `rank`; the single rule table the
// CPU shards here and the CUDA backend slices on the device with.
TpSlice TpSliceOf(const ModelConfig& config, SlotKind kind, const TpRankPlan& rank);

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
