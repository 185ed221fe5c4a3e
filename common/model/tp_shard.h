// Cuts a rank's weights out of the full model (DESIGN §6). Every tensor in ForEachTensor has
// a slicing rule here; a tensor without one is an error, so a new tensor cannot be silently
// replicated or dropped.
//
//   column-parallel (rows of [out, in]):  q/k/v_proj (+ bias), gate_proj, up_proj
//   row-parallel (columns of [out, in]):  o_proj, down_proj
//   vocab-parallel (rows):                embed_tokens, lm_head (tied: the embed slice serves)
//   replicated:                           every RMSNorm weight (layer, q/k, final) and the
//                                         context projection's fc (every rank projects the K/V
//                                         of its heads from the whole context row)
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

// The slicing rule above for the tensor named `hf_name` on the rank `rank`; the single rule
// table the CPU shards here and the CUDA backend slices on the device with. INTERNAL for a
// tensor without a rule.
absl::StatusOr<TpSlice> TpSliceOf(const ModelConfig& config, const std::string& hf_name,
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
