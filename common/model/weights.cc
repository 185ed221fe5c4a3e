#include "common/model/weights.h"

#include "absl/strings/str_cat.h"

namespace treespec {

void ForEachLayerTensor(const ModelConfig& c, const std::string& p, LayerWeights& l,
                        const std::function<void(TensorSlot&)>& fn) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_width = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t inter = c.intermediate_size;
  auto visit = [&](std::string name, std::vector<int64_t> shape, bool present, SlotKind kind,
                   Tensor* t) {
    TensorSlot slot{std::move(name), std::move(shape), present, kind, t};
    fn(slot);
  };
  visit(p + "input_layernorm.weight", {hidden}, true, SlotKind::kNorm, &l.input_norm);
  visit(p + "self_attn.q_proj.weight", {q_width, hidden}, true, SlotKind::kQHeads, &l.wq);
  visit(p + "self_attn.k_proj.weight", {kv_width, hidden}, true, SlotKind::kKvHeads, &l.wk);
  visit(p + "self_attn.v_proj.weight", {kv_width, hidden}, true, SlotKind::kKvHeads, &l.wv);
  visit(p + "self_attn.q_proj.bias", {q_width}, c.qkv_bias, SlotKind::kQHeads, &l.bq);
  visit(p + "self_attn.k_proj.bias", {kv_width}, c.qkv_bias, SlotKind::kKvHeads, &l.bk);
  visit(p + "self_attn.v_proj.bias", {kv_width}, c.qkv_bias, SlotKind::kKvHeads, &l.bv);
  visit(p + "self_attn.q_norm.weight", {c.head_dim}, c.qk_norm, SlotKind::kNorm, &l.q_norm);
  visit(p + "self_attn.k_norm.weight", {c.head_dim}, c.qk_norm, SlotKind::kNorm, &l.k_norm);
  visit(p + "self_attn.o_proj.weight", {hidden, q_width}, true, SlotKind::kQHeadsIn, &l.wo);
  visit(p + "post_attention_layernorm.weight", {hidden}, true, SlotKind::kNorm, &l.post_norm);
  visit(p + "mlp.gate_proj.weight", {inter, hidden}, true, SlotKind::kMlpOut, &l.w_gate);
  visit(p + "mlp.up_proj.weight", {inter, hidden}, true, SlotKind::kMlpOut, &l.w_up);
  visit(p + "mlp.down_proj.weight", {hidden, inter}, true, SlotKind::kMlpIn, &l.w_down);
}

void ForEachTensor(const ModelConfig& c, ModelWeights& w,
                   const std::function<void(TensorSlot&)>& fn) {
  const int64_t hidden = c.hidden_size;
  auto visit = [&](std::string name, std::vector<int64_t> shape, bool present, SlotKind kind,
                   Tensor* t) {
    TensorSlot slot{std::move(name), std::move(shape), present, kind, t};
    fn(slot);
  };
  visit("model.embed_tokens.weight", {c.vocab_size, hidden}, true, SlotKind::kVocab, &w.embed);
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    ForEachLayerTensor(c, absl::StrCat("model.layers.", i, "."), w.layers[i], fn);
  }
  visit("model.norm.weight", {hidden}, true, SlotKind::kNorm, &w.final_norm);
  visit("lm_head.weight", {c.vocab_size, hidden}, !c.tie_word_embeddings, SlotKind::kVocab,
        &w.lm_head);
  visit("fc.weight", {hidden, c.context_width}, c.context_width > 0, SlotKind::kWhole,
        &w.context_fc);
  visit("hidden_norm.weight", {hidden}, c.context_width > 0, SlotKind::kNorm, &w.context_norm);
}

}  // namespace treespec
