// The config.json of a DFlash drafter (arXiv 2602.06036): a few Qwen3-style decoder layers
// conditioned on the target's hidden states, with no embedding or LM head of its own (it uses
// the target's). Hugging Face's format: "architectures": ["DFlashDraftModel"], the Qwen3 fields
// for the draft layers, "num_target_layers", "block_size", and "dflash_config" with
// "target_layer_ids" and "mask_token_id" (block_size may sit there too).
#ifndef TREESPEC_COMMON_MODEL_DFLASH_CONFIG_H_
#define TREESPEC_COMMON_MODEL_DFLASH_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/tree/draft_context.h"

namespace treespec {

struct DflashConfig {
  // The draft layers, as a Qwen3 decoder would read them (num_layers = draft layers; its
  // vocab_size and hidden_size are the target's), with a context projection as wide as a
  // feature row (context_width = target layers × hidden): a CausalLm of this config runs the
  // drafter (CausalLm::AppendContext for the context, a bidirectional SeqTree for the block).
  ModelConfig body;
  std::vector<int> target_layers;  // target layers whose outputs make a feature row
  int target_num_layers = 0;       // the target's layer count
  int mask_token_id = -1;          // fills the block after the bonus token
  int block_size = 16;             // the bonus and block_size - 1 drafted positions

  // What it needs from the verifier (DrafterFactory::features()).
  FeatureSpec features() const {
    return {target_layers, body.hidden_size, target_num_layers, body.vocab_size};
  }
};

// The tree of one DFlash step: the block [bonus, MASK × (size - 1)] after the `context_rows`
// slots of `seq`, bidirectional (SeqTree::bidirectional); rows 1 .. size - 1 of its forward are
// the marginals of depths 1 .. size - 1.
SeqTree DflashBlock(const DflashConfig& config, SeqId seq, int context_rows, int32_t bonus,
                    int size);

// Parses config.json text. Errors name the field; variants this drafter does not implement
// (DFlash2's convolutions and selector, sliding-window or causal draft attention) are
// UNIMPLEMENTED naming the field.
absl::StatusOr<DflashConfig> ParseDflashConfig(const std::string& json_text);
// Reads <dir>/config.json; the error names the file.
absl::StatusOr<DflashConfig> LoadDflashConfig(const std::string& dir);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_DFLASH_CONFIG_H_
