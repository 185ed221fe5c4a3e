// Weights of a DFlash drafter, fp32 on the host: its own tensors (Hugging Face names without a
// "model." prefix: "layers.N.…", "fc.weight", "hidden_norm.weight", "norm.weight") and the
// target's embedding and LM head.
#ifndef TREESPEC_COMMON_MODEL_DFLASH_WEIGHTS_H_
#define TREESPEC_COMMON_MODEL_DFLASH_WEIGHTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dflash_config.h"
#include "common/model/weights.h"

namespace treespec {

// The drafter's weights are a ModelWeights for its body (DflashConfig::body): the draft layers,
// the final norm, the context projection (context_fc = "fc", context_norm = "hidden_norm") and
// the target's embedding and head, which it uses as its own.

// Visits the drafter's own tensor slots (not the target's two), in a fixed order: the loader
// and the random-drafter writer walk this one list.
void ForEachDflashTensor(const DflashConfig& config, ModelWeights& weights,
                         const std::function<void(TensorSlot&)>& fn);

// Loads the drafter's tensors from `drafter_dir` (a tensor there it does not use is an error:
// the checkpoint and config.json disagree) and the embedding and head from the target in
// `target_dir`, which must be the target the drafter was trained for (FAILED_PRECONDITION
// naming both shapes otherwise). Sets config.body.tie_word_embeddings to the target's.
absl::StatusOr<ModelWeights> LoadDflashWeights(const std::string& drafter_dir,
                                               DflashConfig& config,
                                               const std::string& target_dir);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_DFLASH_WEIGHTS_H_
