// Weights of a decoder (the Llama family, the DeepSeek-V3 family), fp32 on the host, in Hugging
// Face layout ([out_features, in_features] for every projection). Loaded from safetensors,
// sharded for TP.
#ifndef TREESPEC_COMMON_MODEL_WEIGHTS_H_
#define TREESPEC_COMMON_MODEL_WEIGHTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/tensor.h"

namespace treespec {

// A GQA attention block (AttentionKind::kGqa), under "self_attn.".
struct GqaWeights {
  Tensor wq;      // [q_heads * head_dim, hidden]
  Tensor wk;      // [kv_heads * head_dim, hidden]
  Tensor wv;      // [kv_heads * head_dim, hidden]
  Tensor bq;      // [q_heads * head_dim]   (qkv_bias only, else empty)
  Tensor bk;      // [kv_heads * head_dim]  (qkv_bias only)
  Tensor bv;      // [kv_heads * head_dim]  (qkv_bias only)
  Tensor q_norm;  // [head_dim]             (qk_norm only)
  Tensor k_norm;  // [head_dim]             (qk_norm only)
  Tensor wo;      // [hidden, q_heads * head_dim]
};

// A multi-head latent attention block (AttentionKind::kMla), under "self_attn.". H query heads;
// qk = qk_nope_head_dim + qk_rope_head_dim, each head's query is [nope part, rope part].
struct MlaWeights {
  Tensor wq;         // [H * qk, hidden]       q_proj (q_lora_rank == 0 only)
  Tensor wq_a;       // [q_lora_rank, hidden]  q_a_proj (q_lora_rank > 0 only)
  Tensor q_a_norm;   // [q_lora_rank]          q_a_layernorm
  Tensor wq_b;       // [H * qk, q_lora_rank]  q_b_proj
  Tensor wkv_a;      // [kv_lora_rank + qk_rope_head_dim, hidden]  kv_a_proj_with_mqa
  Tensor kv_a_norm;  // [kv_lora_rank]         kv_a_layernorm
  Tensor wkv_b;      // [H * (qk_nope_head_dim + v_head_dim), kv_lora_rank]  kv_b_proj:
                     //   per head qk_nope_head_dim key rows (W_uk), then v_head_dim value rows
  Tensor wo;         // [hidden, H * v_head_dim]
};

// A dense gated MLP (MlpKind::kDense), under "mlp."; also each expert of a MoE MLP.
struct DenseMlpWeights {
  Tensor w_gate;  // [intermediate, hidden]
  Tensor w_up;    // [intermediate, hidden]
  Tensor w_down;  // [hidden, intermediate]
};

// A mixture-of-experts MLP (MlpKind::kMoe), under "mlp.": E routed experts of width
// moe_intermediate_size and the shared experts as one MLP of width that × n_shared_experts.
struct MoeWeights {
  Tensor router;                         // [E, hidden]  gate.weight
  Tensor score_bias;                     // [E]          gate.e_score_correction_bias
  std::vector<DenseMlpWeights> experts;  // [E]          experts.{e}.*
  DenseMlpWeights shared;                // shared_experts.* ([0, hidden] when none)
};

// One decoder layer: the blocks its LayerSpec names hold tensors, the others stay empty.
struct LayerWeights {
  Tensor input_norm;  // [hidden]
  GqaWeights gqa;
  MlaWeights mla;
  Tensor post_norm;  // [hidden]  (post_attention_layernorm)
  DenseMlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  Tensor embed;                      // [vocab, hidden]
  std::vector<LayerWeights> layers;  // [num_layers]
  Tensor final_norm;                 // [hidden]
  Tensor lm_head;                    // [vocab, hidden]; empty when tie_word_embeddings (use embed)
  // The context projection (config.context_width > 0; DFlash's "fc" and "hidden_norm"): a
  // context row c = RMSNorm(row · context_fcᵀ) · context_norm feeds every layer's K/V.
  Tensor context_fc;    // [hidden, context_width]
  Tensor context_norm;  // [hidden]
};

// What a tensor slot holds, which says how tensor parallelism cuts it (TpSliceOf in
// tp_shard.h) and how random weights fill it. Rank-1 slots of a head or MLP kind are biases.
enum class SlotKind {
  kVocab,     // [vocab, hidden]: rows of the rank's vocabulary range (embedding, LM head)
  kNorm,      // an RMSNorm weight: every rank holds it whole
  kQHeads,    // rows (a bias: elements) of the rank's query heads (q_proj)
  kKvHeads,   // rows (a bias: elements) of the rank's KV heads (k_proj, v_proj)
  kQHeadsIn,  // columns of the rank's query heads: attention's output projection (o_proj)
  kMlpOut,    // rows of the rank's MLP slice (gate_proj, up_proj)
  kMlpIn,     // columns of the rank's MLP slice: the MLP's output projection (down_proj)
  kWhole,     // any other tensor every rank holds whole (the context projection's fc)
};

// Describes one tensor slot for the loader, the random-model writer and the TP sharder:
// its Hugging Face name, expected full shape, whether the config says it exists, and its kind.
struct TensorSlot {
  std::string hf_name;         // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // full (unsharded) shape
  bool present;                // false: optional tensor this config does not use
  SlotKind kind;
  Tensor* tensor;  // where it lives in ModelWeights
};

// How a test or benchmark model's random weights spread in `slot` (uniform, mean `center`,
// standard deviation `sigma`): norms 1 ± 0.2, biases std 0.3, the embedding and LM head std
// 3/sqrt(hidden) (logits ~N(0, 3²) after the final norm), projections std 1/sqrt(in_features),
// which keep activations O(1). testing::RandomWeights fills host tensors so, the CUDA backend's
// RandomTensors device ones.
struct RandomSpread {
  float center = 0.0f, sigma = 0.0f;
};
RandomSpread RandomSpreadOf(const TensorSlot& slot, int hidden_size);

// Visits the tensor slots of decoder layer `index` (its blocks as LayerSpecOf says), named
// `prefix` + "self_attn.q_proj.weight" etc.
void ForEachLayerTensor(const ModelConfig& config, int index, const std::string& prefix,
                        LayerWeights& layer, const std::function<void(TensorSlot&)>& fn);

// Visits every tensor slot of `weights` for `config`, in a fixed order. The single list of
// tensors: add a tensor here and the loader, writer and sharder all see it.
void ForEachTensor(const ModelConfig& config, ModelWeights& weights,
                   const std::function<void(TensorSlot&)>& fn);

// Calls its argument on every tensor slot of some set of weights (ForEachTensor's shape).
using SlotVisitor = std::function<void(const std::function<void(TensorSlot&)>&)>;

// Reads every present slot `for_each` visits from the checkpoint in `model_dir` (one
// model.safetensors, or shards listed by model.safetensors.index.json; f32/f16/bf16) into fp32,
// checking each shape. Returns the checkpoint's other tensors (sorted; saved RoPE buffers left
// out), for the caller's policy on extras. Errors name the file and the tensor.
absl::StatusOr<std::vector<std::string>> LoadTensorSlots(const std::string& model_dir,
                                                         const SlotVisitor& for_each);

// Loads config.json + *.safetensors (single file or sharded with model.safetensors.index.json;
// f32/f16/bf16) from `model_dir`. Errors name the file and the tensor.
absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const ModelConfig& config);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_WEIGHTS_H_
