// Test and benchmark helpers for the models: small configs, seeded random weights in memory,
// chains and random trees to run through them.
#ifndef TREESPEC_COMMON_MODEL_CPU_TEST_UTIL_H_
#define TREESPEC_COMMON_MODEL_CPU_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/weights.h"

namespace treespec::testing {

// A small Llama-shaped config: 8 q / 4 kv heads of 16, tied embeddings.
inline ModelConfig SmallLlamaConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 320;
  c.num_layers = 2;
  c.num_q_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = true;
  return c;
}

// The shape of the embedded tiny target (DESIGN §5): 6 layers × 256, 8 q / 4 kv heads, MLP 704,
// vocab 4096, tied embeddings.
inline ModelConfig TinyTargetConfig() {
  ModelConfig c = SmallLlamaConfig();
  c.vocab_size = 4096;
  c.hidden_size = 256;
  c.intermediate_size = 704;
  c.num_layers = 6;
  c.head_dim = 32;
  c.max_position_embeddings = 2048;
  return c;
}

// A small DeepSeek-V3-shaped config: MLA with q LoRA over 8 heads whose widths are not powers
// of two (nope 24, rope 12, v 20, latent 40 + 12), a dense first layer, then MoE layers of 8
// experts in 4 groups (2 kept, 3 experts per token) of width 128 with 2 shared experts, and
// YaRN with DeepSeek's mscale fields.
inline ModelConfig SmallDeepseekConfig() {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 96;
  c.intermediate_size = 192;
  c.num_layers = 3;
  c.num_q_heads = 8;
  c.num_kv_heads = 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  c.attention = AttentionKind::kMla;
  c.mla.q_lora_rank = 48;
  c.mla.kv_lora_rank = 40;
  c.mla.qk_nope_head_dim = 24;
  c.mla.qk_rope_head_dim = 12;
  c.mla.v_head_dim = 20;
  c.mla.rope_interleave = true;
  c.head_dim = c.mla.qk_rope_head_dim;
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::kYarn;
  rs.factor = 4.0f;
  rs.original_max_position_embeddings = 64;
  rs.mscale = 1.0f;
  rs.mscale_all_dim = 0.5f;
  rs.attention_factor = static_cast<float>(YarnMscale(4.0, 1.0) / YarnMscale(4.0, 0.5));
  const double mscale = YarnMscale(4.0, 0.5);
  c.mla.softmax_scale = static_cast<float>(mscale * mscale / std::sqrt(36.0));
  c.moe.num_experts = 8;
  c.moe.num_shared_experts = 2;
  c.moe.experts_per_token = 3;
  c.moe.num_groups = 4;
  c.moe.topk_groups = 2;
  c.moe.expert_intermediate_size = 128;
  c.moe.first_dense_layers = 1;
  c.moe.routed_scaling_factor = 2.5f;
  c.moe.norm_topk_prob = true;
  return c;
}

// Uniform in [-a, a] with a = sqrt(3) * sigma, so the standard deviation is sigma.
inline void FillUniform(std::mt19937_64& rng, float center, float sigma, Tensor& t) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float a = std::sqrt(3.0f) * sigma;
  for (float& v : t.span()) v = center + a * u(rng);
}

// Seeded random weights that keep activations O(1) and logits spread over a few units
// (RandomSpreadOf).
inline ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ModelWeights w;
  ForEachTensor(config, w, [&](TensorSlot& slot) {
    if (!slot.present) return;
    *slot.tensor = Tensor(slot.shape);
    const RandomSpread spread = RandomSpreadOf(slot, config.hidden_size);
    FillUniform(rng, spread.center, spread.sigma, *slot.tensor);
  });
  return w;
}

// A chain of `tokens` after `committed` slots (prefill, or decoding one token).
inline SeqTree Chain(SeqId seq, int committed, const std::vector<int32_t>& tokens) {
  SeqTree t;
  t.seq = seq;
  t.committed_len = committed;
  t.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) t.parents.push_back(static_cast<int32_t>(i) - 1);
  return t;
}

// A tree of n nodes after `committed` slots: random tokens in [0, vocab), each node's parent
// drawn among the earlier nodes (node 0 is the root).
inline SeqTree RandomTree(SeqId seq, int committed, int n, int vocab, std::mt19937& rng) {
  SeqTree t;
  t.seq = seq;
  t.committed_len = committed;
  for (int i = 0; i < n; ++i) {
    t.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    t.parents.push_back(i == 0 ? -1 : static_cast<int32_t>(rng() % i));
  }
  return t;
}

// The worst error of `got` against `want` (same shape), per row and captured layer relative to
// that layer's largest |value| in the row: feature rows compare by scale, as logits do.
inline double WorstFeatureError(const TargetFeatures& got, const TargetFeatures& want, int hidden) {
  if (got.rows != want.rows || got.width != want.width) return INFINITY;
  double worst = 0;
  for (int row = 0; row < want.rows; ++row) {
    for (int at = 0; at < want.width; at += hidden) {
      double err = 0, scale = 0;
      for (int c = 0; c < hidden; ++c) {
        const size_t i = static_cast<size_t>(row) * want.width + at + c;
        const double w = Bf16BitsToFloat(want.bf16[i]);
        err = std::max(err, std::abs(Bf16BitsToFloat(got.bf16[i]) - w));
        scale = std::max(scale, std::abs(w));
      }
      worst = std::max(worst, scale > 0 ? err / scale : err);
    }
  }
  return worst;
}

}  // namespace treespec::testing

#endif  // TREESPEC_COMMON_MODEL_CPU_TEST_UTIL_H_
