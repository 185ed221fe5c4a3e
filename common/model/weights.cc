#include "common/model/weights.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace treespec {

namespace {

using SlotFn = std::function<void(TensorSlot&)>;

void Visit(const SlotFn& fn, std::string name, std::vector<int64_t> shape, bool present,
           SlotKind kind, Tensor* t) {
  TensorSlot slot{std::move(name), std::move(shape), present, kind, t};
  fn(slot);
}

void GqaTensors(const ModelConfig& c, const std::string& p, GqaWeights& w, const SlotFn& fn) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_width = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  Visit(fn, p + "q_proj.weight", {q_width, hidden}, true, SlotKind::kQHeads, &w.wq);
  Visit(fn, p + "k_proj.weight", {kv_width, hidden}, true, SlotKind::kKvHeads, &w.wk);
  Visit(fn, p + "v_proj.weight", {kv_width, hidden}, true, SlotKind::kKvHeads, &w.wv);
  Visit(fn, p + "q_proj.bias", {q_width}, c.qkv_bias, SlotKind::kQHeads, &w.bq);
  Visit(fn, p + "k_proj.bias", {kv_width}, c.qkv_bias, SlotKind::kKvHeads, &w.bk);
  Visit(fn, p + "v_proj.bias", {kv_width}, c.qkv_bias, SlotKind::kKvHeads, &w.bv);
  Visit(fn, p + "q_norm.weight", {c.head_dim}, c.qk_norm, SlotKind::kNorm, &w.q_norm);
  Visit(fn, p + "k_norm.weight", {c.head_dim}, c.qk_norm, SlotKind::kNorm, &w.k_norm);
  Visit(fn, p + "o_proj.weight", {hidden, q_width}, true, SlotKind::kQHeadsIn, &w.wo);
}

void MlaTensors(const ModelConfig& c, const std::string& p, MlaWeights& w, const SlotFn& fn) {
  const MlaConfig& m = c.mla;
  const int64_t hidden = c.hidden_size, heads = c.num_q_heads;
  const bool lora = m.q_lora_rank > 0;
  const int64_t q_width = heads * m.qk_head_dim();
  Visit(fn, p + "q_proj.weight", {q_width, hidden}, !lora, SlotKind::kQHeads, &w.wq);
  Visit(fn, p + "q_a_proj.weight", {m.q_lora_rank, hidden}, lora, SlotKind::kWhole, &w.wq_a);
  Visit(fn, p + "q_a_layernorm.weight", {m.q_lora_rank}, lora, SlotKind::kNorm, &w.q_a_norm);
  Visit(fn, p + "q_b_proj.weight", {q_width, m.q_lora_rank}, lora, SlotKind::kQHeads, &w.wq_b);
  Visit(fn, p + "kv_a_proj_with_mqa.weight", {m.latent_width(), hidden}, true, SlotKind::kWhole,
        &w.wkv_a);
  Visit(fn, p + "kv_a_layernorm.weight", {m.kv_lora_rank}, true, SlotKind::kNorm, &w.kv_a_norm);
  Visit(fn, p + "kv_b_proj.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
        true, SlotKind::kQHeads, &w.wkv_b);
  Visit(fn, p + "o_proj.weight", {hidden, heads * m.v_head_dim}, true, SlotKind::kQHeadsIn, &w.wo);
}

// A gated MLP `inter` wide.
void GatedMlpTensors(const ModelConfig& c, int64_t inter, const std::string& p, DenseMlpWeights& w,
                     const SlotFn& fn) {
  const int64_t hidden = c.hidden_size;
  Visit(fn, p + "gate_proj.weight", {inter, hidden}, true, SlotKind::kMlpOut, &w.w_gate);
  Visit(fn, p + "up_proj.weight", {inter, hidden}, true, SlotKind::kMlpOut, &w.w_up);
  Visit(fn, p + "down_proj.weight", {hidden, inter}, true, SlotKind::kMlpIn, &w.w_down);
}

void DenseMlpTensors(const ModelConfig& c, const std::string& p, DenseMlpWeights& w,
                     const SlotFn& fn) {
  GatedMlpTensors(c, c.intermediate_size, p, w, fn);
}

void MoeTensors(const ModelConfig& c, const std::string& p, MoeWeights& w, const SlotFn& fn) {
  const MoeConfig& e = c.moe;
  const int64_t hidden = c.hidden_size;
  Visit(fn, p + "gate.weight", {e.num_experts, hidden}, true, SlotKind::kWhole, &w.router);
  Visit(fn, p + "gate.e_score_correction_bias", {e.num_experts}, true, SlotKind::kWhole,
        &w.score_bias);
  w.experts.resize(e.num_experts);
  for (int i = 0; i < e.num_experts; ++i) {
    GatedMlpTensors(c, e.expert_intermediate_size, absl::StrCat(p, "experts.", i, "."),
                    w.experts[i], fn);
  }
  GatedMlpTensors(c, int64_t{e.expert_intermediate_size} * e.num_shared_experts,
                  p + "shared_experts.", w.shared, fn);
}

}  // namespace

RandomSpread RandomSpreadOf(const TensorSlot& slot, int hidden_size) {
  if (slot.kind == SlotKind::kNorm) return {1.0f, 0.2f};
  if (slot.shape.size() == 1) return {0.0f, 0.3f};  // a bias
  if (slot.kind == SlotKind::kVocab) {
    return {0.0f, 3.0f / std::sqrt(static_cast<float>(hidden_size))};
  }
  return {0.0f, 1.0f / std::sqrt(static_cast<float>(slot.shape[1]))};
}

void ForEachLayerTensor(const ModelConfig& c, int index, const std::string& p, LayerWeights& l,
                        const SlotFn& fn) {
  const int64_t hidden = c.hidden_size;
  const LayerSpec spec = LayerSpecOf(c, index);
  Visit(fn, p + "input_layernorm.weight", {hidden}, true, SlotKind::kNorm, &l.input_norm);
  switch (spec.attention) {
    case AttentionKind::kGqa:
      GqaTensors(c, p + "self_attn.", l.gqa, fn);
      break;
    case AttentionKind::kMla:
      MlaTensors(c, p + "self_attn.", l.mla, fn);
      break;
  }
  Visit(fn, p + "post_attention_layernorm.weight", {hidden}, true, SlotKind::kNorm, &l.post_norm);
  switch (spec.mlp) {
    case MlpKind::kDense:
      DenseMlpTensors(c, p + "mlp.", l.mlp, fn);
      break;
    case MlpKind::kMoe:
      MoeTensors(c, p + "mlp.", l.moe, fn);
      break;
  }
}

void ForEachTensor(const ModelConfig& c, ModelWeights& w, const SlotFn& fn) {
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  Visit(fn, "model.embed_tokens.weight", {vocab, hidden}, true, SlotKind::kVocab, &w.embed);
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    ForEachLayerTensor(c, i, absl::StrCat("model.layers.", i, "."), w.layers[i], fn);
  }
  Visit(fn, "model.norm.weight", {hidden}, true, SlotKind::kNorm, &w.final_norm);
  Visit(fn, "lm_head.weight", {vocab, hidden}, !c.tie_word_embeddings, SlotKind::kVocab,
        &w.lm_head);
  const bool context = c.context_width > 0;
  Visit(fn, "fc.weight", {hidden, c.context_width}, context, SlotKind::kWhole, &w.context_fc);
  Visit(fn, "hidden_norm.weight", {hidden}, context, SlotKind::kNorm, &w.context_norm);
}

}  // namespace treespec
