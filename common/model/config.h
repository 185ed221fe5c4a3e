// Model hyper-parameters read from a Hugging Face config.json (Llama family).
#ifndef TREESPEC_COMMON_MODEL_CONFIG_H_
#define TREESPEC_COMMON_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace treespec {

// RoPE frequency scaling, as `rope_scaling` in config.json says.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;              // llama3
  float high_freq_factor = 4.0f;             // llama3
  int original_max_position_embeddings = 0;  // llama3, yarn
  float beta_fast = 32.0f;                   // yarn
  float beta_slow = 1.0f;                    // yarn
  float attention_factor = 1.0f;             // yarn: scales cos/sin (mscale); 1 elsewhere
};

// The blocks one decoder layer is made of. Every consumer of a model (the tensor list, both
// forwards) dispatches on these per layer, so an architecture with other blocks (MLA
// attention, mixture-of-experts MLPs) adds a kind and its block functions, not flags inside
// the existing ones.
enum class AttentionKind {
  kGqa,  // grouped-query attention with RoPE: per-head K/V (MHA and MQA are group sizes)
};
enum class MlpKind {
  kDense,  // down(silu(gate(x)) * up(x))
};
struct LayerSpec {
  AttentionKind attention = AttentionKind::kGqa;
  MlpKind mlp = MlpKind::kDense;
};

struct ModelConfig {
  // One of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
  std::string architecture;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                 // hidden_size / num_q_heads unless config sets head_dim
  int max_position_embeddings = 0;  // the context length we serve
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry a bias
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  // Width of the rows a context projection reads (a DFlash drafter's target features: target
  // layers × target hidden); 0 = the model has none. Never set by config.json of a plain model:
  // ParseDflashConfig sets it for a drafter's body (CausalLm::AppendContext).
  int context_width = 0;
};

// The blocks of layer `layer` (0-based) of `config`.
LayerSpec LayerSpecOf(const ModelConfig& config, int layer);

// Parses config.json text. Unknown architectures and fields that would change the math
// (sliding window in use, unsupported rope_scaling type, hidden_act other than silu, ...)
// are errors that name the field.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

// The text of <dir>/config.json; NOT_FOUND naming the file and asking whether `dir` is `what`
// ("a model directory").
absl::StatusOr<std::string> ReadConfigJson(const std::string& dir, absl::string_view what);
// A parse error's message ("config.json field `x`: ...") naming the file in `dir` instead.
absl::Status NameConfigFile(const absl::Status& status, const std::string& dir);

// Reads <model_dir>/config.json; the error names the file.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Inverse RoPE frequencies after scaling. [head_dim / 2]
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_CONFIG_H_
