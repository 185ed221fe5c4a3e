// Model hyper-parameters read from a Hugging Face config.json: the Llama family (Llama,
// Mistral, Qwen2, Qwen3) and the DeepSeek-V3 family (DeepSeek-V3, Kimi-K2: MLA + MoE).
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
  // yarn as DeepSeek writes it: attention_factor = mscale(factor, mscale) / mscale(factor,
  // mscale_all_dim); MLA's softmax scale also takes mscale(factor, mscale_all_dim)². 0 = absent.
  float mscale = 0.0f;
  float mscale_all_dim = 0.0f;
};

// The blocks one decoder layer is made of. Every consumer of a model (the tensor list, both
// forwards) dispatches on these per layer, so an architecture with other blocks (MLA
// attention, mixture-of-experts MLPs) adds a kind and its block functions, not flags inside
// the existing ones.
enum class AttentionKind {
  kGqa,  // grouped-query attention with RoPE: per-head K/V (MHA and MQA are group sizes)
  kMla,  // multi-head latent attention (DeepSeek-V2/V3): K/V from one shared latent per token
};
enum class MlpKind {
  kDense,  // down(silu(gate(x)) * up(x))
  kMoe,    // routed experts (sigmoid router, group-limited top-k) plus shared experts
};
struct LayerSpec {
  AttentionKind attention = AttentionKind::kGqa;
  MlpKind mlp = MlpKind::kDense;
};

// Multi-head latent attention, as Transformers' DeepseekV3Attention computes it. Per token one
// latent c_kv = RMSNorm(x · W_kvaᵀ[:kv_lora_rank]) and one rotated key part
// k_rope = RoPE(x · W_kvaᵀ[kv_lora_rank:]) serve every head: head h's key is
// [W_uk[h] · c_kv, k_rope], its value W_uv[h] · c_kv (W_uk, W_uv: kv_b_proj's rows).
struct MlaConfig {
  int q_lora_rank = 0;       // 0: a direct q_proj; else q_a_proj → RMSNorm → q_b_proj
  int kv_lora_rank = 0;      // width of c_kv
  int qk_nope_head_dim = 0;  // the per-head key part without RoPE
  int qk_rope_head_dim = 0;  // the shared rotated key part (== ModelConfig::head_dim)
  int v_head_dim = 0;
  // Transformers' rope_interleave: the rotary part's (d/2, 2) pairs regrouped into halves
  // before rotate-half (DeepSeek's checkpoints are laid out for interleaved RoPE).
  bool rope_interleave = true;
  float softmax_scale = 0.0f;  // qk_head_dim^-0.5, × mscale(factor, mscale_all_dim)² (YaRN)

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One cache entry per token and layer: [c_kv, k_rope] (576 values for DeepSeek-V3).
  int latent_width() const { return kv_lora_rank + qk_rope_head_dim; }
};

// A DeepSeek-V3 mixture-of-experts MLP. Router, as Transformers' DeepseekV3TopkRouter, in fp32:
// s = sigmoid(x · W_gateᵀ); experts are chosen on s + e_score_correction_bias within the
// topk_groups groups whose top-2 biased scores sum highest; their weights are the unbiased s,
// normalized to sum 1 when norm_topk_prob, times routed_scaling_factor. The output adds the
// shared experts (one dense MLP of width expert_intermediate_size × num_shared_experts).
struct MoeConfig {
  int num_experts = 0;  // n_routed_experts; 0: the model has no MoE layers
  int num_shared_experts = 0;
  int experts_per_token = 0;         // num_experts_per_tok
  int num_groups = 1;                // n_group (divides num_experts)
  int topk_groups = 1;               // topk_group (<= num_groups)
  int expert_intermediate_size = 0;  // moe_intermediate_size
  int first_dense_layers = 0;        // first_k_dense_replace: layers [0, this) are dense
  float routed_scaling_factor = 1.0f;
  bool norm_topk_prob = true;
};

struct ModelConfig {
  // One of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
  // DeepseekV3ForCausalLM.
  std::string architecture;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  // GQA: hidden_size / num_q_heads unless config sets head_dim. MLA: the rotary part's width
  // (qk_rope_head_dim), as DeepseekV3Config sets head_dim: RoPE tables are this wide.
  int head_dim = 0;
  int max_position_embeddings = 0;  // the context length we serve
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry a bias
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  AttentionKind attention = AttentionKind::kGqa;  // every layer's
  MlaConfig mla;                                  // attention == kMla only
  MoeConfig moe;                                  // moe.num_experts > 0 only
  // Multi-token-prediction layers stored after the decoder's (DeepSeek-V3's
  // num_nextn_predict_layers): not part of the forward; the loader skips their tensors.
  int num_mtp_layers = 0;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  // Width of the rows a context projection reads (a DFlash drafter's target features: target
  // layers × target hidden); 0 = the model has none. Never set by config.json of a plain model:
  // ParseDflashConfig sets it for a drafter's body (CausalLm::AppendContext).
  int context_width = 0;
};

// The blocks of layer `layer` (0-based) of `config`.
LayerSpec LayerSpecOf(const ModelConfig& config, int layer);

// YaRN's attention factor ("mscale") for a context extended by `scale`: 1 + 0.1 mscale ln(scale).
double YarnMscale(double scale, double mscale);

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
