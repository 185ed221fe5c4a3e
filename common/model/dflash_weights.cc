#include "common/model/dflash_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace treespec {

void ForEachDflashTensor(const DflashConfig& config, ModelWeights& w,
                         const std::function<void(TensorSlot&)>& fn) {
  const ModelConfig& c = config.body;
  const int64_t hidden = c.hidden_size;
  auto visit = [&](std::string name, std::vector<int64_t> shape, SlotKind kind, Tensor* t) {
    TensorSlot slot{std::move(name), std::move(shape), true, kind, t};
    fn(slot);
  };
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    ForEachLayerTensor(c, i, absl::StrCat("layers.", i, "."), w.layers[i], fn);
  }
  visit("norm.weight", {hidden}, SlotKind::kNorm, &w.final_norm);
  visit("fc.weight", {hidden, c.context_width}, SlotKind::kWhole, &w.context_fc);
  visit("hidden_norm.weight", {hidden}, SlotKind::kNorm, &w.context_norm);
}

absl::StatusOr<ModelWeights> LoadDflashWeights(const std::string& drafter_dir, DflashConfig& config,
                                               const std::string& target_dir) {
  ASSIGN_OR_RETURN(ModelConfig target, LoadModelConfig(target_dir));
  RETURN_IF_ERROR(CheckFeatureTarget(config.features(), target.hidden_size, target.num_layers,
                                     target.vocab_size,
                                     absl::StrCat("the DFlash drafter in ", drafter_dir)));
  ModelWeights w;
  ASSIGN_OR_RETURN(
      std::vector<std::string> extra,
      LoadTensorSlots(drafter_dir, [&](const auto& fn) { ForEachDflashTensor(config, w, fn); }));
  if (!extra.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(drafter_dir, ": tensors '", absl::StrJoin(extra, "', '"),
                     "' are not used by a DFlashDraftModel with this config.json (",
                     config.body.num_layers, " layers): the checkpoint and config.json disagree"));
  }
  // From the target: only its embedding and head (the rest of its checkpoint is not read).
  std::vector<TensorSlot> slots = {{"model.embed_tokens.weight",
                                    {target.vocab_size, target.hidden_size},
                                    true,
                                    SlotKind::kVocab,
                                    &w.embed},
                                   {"lm_head.weight",
                                    {target.vocab_size, target.hidden_size},
                                    !target.tie_word_embeddings,
                                    SlotKind::kVocab,
                                    &w.lm_head}};
  RETURN_IF_ERROR(LoadTensorSlots(target_dir, [&](const auto& fn) {
                    for (TensorSlot& slot : slots) fn(slot);
                  }).status());
  config.body.tie_word_embeddings = target.tie_word_embeddings;
  return w;
}

}  // namespace treespec
