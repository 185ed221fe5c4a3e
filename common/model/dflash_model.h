// The DFlash drafter's forward on the CPU, fp32 (the reference the GPU drafter is checked
// against; arXiv 2602.06036). A session's context is the K/V its target features make in every
// draft layer; one forward over a block [bonus, MASK × (B - 1)] gives the draft distribution of
// each of the B - 1 positions after the bonus at once.
//
//   context rows:  c = hidden_norm(fc(features)); per layer K = rope(k_norm(c Wk)), V = c Wv
//                  (no input norm: the same c feeds every layer), at the rows' own positions.
//   block:         h = embed(block tokens) at positions p .. p + B - 1 (p = the bonus's);
//                  per layer, Qwen3's decoder layer whose attention keys and values are the
//                  context's followed by the block's own, every block row seeing all of them
//                  (not causal); then the final norm and the target's LM head on rows 1 .. B-1.
#ifndef TREESPEC_COMMON_MODEL_DFLASH_MODEL_H_
#define TREESPEC_COMMON_MODEL_DFLASH_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dflash_config.h"
#include "common/model/dflash_weights.h"
#include "common/tree/draft_context.h"

namespace treespec {

// One session's context: a row per context token, positions 0 .. rows - 1.
struct DflashContext {
  int rows = 0;
  std::vector<std::vector<float>> k, v;  // per draft layer, [rows, kv heads × head_dim]
};

class CpuDflashModel {
 public:
  CpuDflashModel(DflashConfig config, DflashWeights weights);
  // Loads the drafter in `drafter_dir` with the embedding and head of the target in
  // `target_dir` (LoadDflashWeights).
  static absl::StatusOr<std::unique_ptr<CpuDflashModel>> Load(const std::string& drafter_dir,
                                                              const std::string& target_dir);

  const DflashConfig& config() const { return config_; }

  // Appends `rows` (the target features of the next context tokens, as wide as
  // config().features().width()) to `context`. INVALID_ARGUMENT for another width.
  absl::Status Append(DflashContext& context, const TargetFeatures& rows) const;

  // Logits [block - 1, vocab] (row-major) of block positions 1 .. block - 1 after `bonus`,
  // which sits at position context.rows. INVALID_ARGUMENT for a bonus outside the vocabulary
  // or a block below 2.
  absl::StatusOr<std::vector<float>> BlockLogits(const DflashContext& context, int32_t bonus,
                                                 int block) const;

 private:
  DflashConfig config_;
  DflashWeights w_;
  std::vector<float> inv_freq_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_DFLASH_MODEL_H_
