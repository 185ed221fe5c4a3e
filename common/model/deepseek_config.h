// The DeepSeek-V3 family's config.json (DeepseekV3ForCausalLM: DeepSeek-V3, Kimi-K2 and others
// of model type deepseek_v3 or kimi_k2): multi-head latent attention in every layer, MoE MLPs
// from layer first_k_dense_replace on. Internal to ParseModelConfig (config.cc), which reads
// the fields every family shares first.
#ifndef TREESPEC_COMMON_MODEL_DEEPSEEK_CONFIG_H_
#define TREESPEC_COMMON_MODEL_DEEPSEEK_CONFIG_H_

#include "absl/status/status.h"
#include "common/model/config.h"
#include "nlohmann/json.hpp"

namespace treespec {

// Reads the heads, MLA, MoE and MTP fields of `root` into `config`, whose shared fields (sizes,
// norm epsilon, RoPE) are already parsed. Fields whose defaults in DeepseekV3Config are fixed
// constants unrelated to the rest of the config (the MLA widths, the expert counts) are
// required; values that would change the math in ways not implemented are refused naming the
// field (UNIMPLEMENTED), inconsistent ones too (INVALID_ARGUMENT).
absl::Status ParseDeepseekV3(const nlohmann::json& root, ModelConfig& config);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_DEEPSEEK_CONFIG_H_
