// Fuzzes config.json parsing (ParseModelConfig). A config that parses must describe a model the
// backends can build: positive sizes, whole heads, an even head_dim, and every float the model
// uses finite and in range *after* narrowing to float (a double that passes a check can still
// round to 0 or overflow to infinity as a float). The RoPE frequencies must be finite (an
// absurd scaling factor may underflow one to 0, which only stops that pair rotating).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace treespec {
namespace {

void CheckConfig(const ModelConfig& c) {
  const std::string shape = absl::StrCat(
      "vocab ", c.vocab_size, " hidden ", c.hidden_size, " inter ", c.intermediate_size, " layers ",
      c.num_layers, " heads ", c.num_q_heads, "/", c.num_kv_heads, " head_dim ", c.head_dim,
      " context ", c.max_position_embeddings);
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
                 c.num_q_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0 &&
                 c.max_position_embeddings > 0,
             shape);
  FUZZ_CHECK(c.num_q_heads % c.num_kv_heads == 0, shape);
  FUZZ_CHECK(c.head_dim % 2 == 0, shape);
  FUZZ_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0,
             absl::StrCat("rms_norm_eps ", c.rms_norm_eps));
  FUZZ_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 1,
             absl::StrCat("rope_theta ", c.rope_theta));
  const RopeScaling& rs = c.rope_scaling;
  const std::string rope =
      absl::StrCat("factor ", rs.factor, " low ", rs.low_freq_factor, " high ", rs.high_freq_factor,
                   " original ", rs.original_max_position_embeddings, " beta ", rs.beta_fast, "/",
                   rs.beta_slow, " attention ", rs.attention_factor);
  FUZZ_CHECK(std::isfinite(rs.factor) && rs.factor > 0, rope);
  FUZZ_CHECK(std::isfinite(rs.attention_factor) && rs.attention_factor > 0, rope);
  FUZZ_CHECK(rs.original_max_position_embeddings >= 0, rope);
  if (rs.type == RopeScaling::Type::kLlama3) {
    FUZZ_CHECK(std::isfinite(rs.low_freq_factor) && rs.low_freq_factor > 0, rope);
    FUZZ_CHECK(std::isfinite(rs.high_freq_factor) && rs.high_freq_factor > rs.low_freq_factor,
               rope);
    FUZZ_CHECK(rs.original_max_position_embeddings > 0, rope);
  }
  if (rs.type == RopeScaling::Type::kYarn) {
    FUZZ_CHECK(std::isfinite(rs.beta_fast) && rs.beta_fast > 0, rope);
    FUZZ_CHECK(std::isfinite(rs.beta_slow) && rs.beta_slow > 0, rope);
  }
  if (c.attention == AttentionKind::kMla) {
    const MlaConfig& m = c.mla;
    const std::string mla = absl::StrCat("q_lora ", m.q_lora_rank, " kv_lora ", m.kv_lora_rank,
                                         " nope ", m.qk_nope_head_dim, " rope ", m.qk_rope_head_dim,
                                         " v ", m.v_head_dim, " scale ", m.softmax_scale);
    FUZZ_CHECK(m.q_lora_rank >= 0 && m.kv_lora_rank > 0 && m.qk_nope_head_dim > 0 &&
                   m.v_head_dim > 0 && m.qk_rope_head_dim == c.head_dim,
               mla);
    FUZZ_CHECK(c.num_kv_heads == c.num_q_heads, mla);
    FUZZ_CHECK(std::isfinite(m.softmax_scale) && m.softmax_scale > 0, mla);
  }
  if (c.moe.num_experts > 0) {
    const MoeConfig& e = c.moe;
    const std::string moe = absl::StrCat(
        "experts ", e.num_experts, " groups ", e.num_groups, "/", e.topk_groups, " per token ",
        e.experts_per_token, " width ", e.expert_intermediate_size, " dense ",
        e.first_dense_layers, " scaling ", e.routed_scaling_factor);
    FUZZ_CHECK(e.num_groups > 0 && e.num_experts % e.num_groups == 0 &&
                   e.num_experts / e.num_groups >= 2,
               moe);
    FUZZ_CHECK(e.topk_groups > 0 && e.topk_groups <= e.num_groups, moe);
    FUZZ_CHECK(e.experts_per_token > 0 &&
                   e.experts_per_token <= e.topk_groups * (e.num_experts / e.num_groups),
               moe);
    FUZZ_CHECK(e.expert_intermediate_size > 0 && e.num_shared_experts >= 0, moe);
    FUZZ_CHECK(e.first_dense_layers < c.num_layers, moe);
    FUZZ_CHECK(std::isfinite(e.routed_scaling_factor) && e.routed_scaling_factor > 0, moe);
  }
  // head_dim may legitimately be up to 2^30; the table is head_dim / 2 doubles, so only
  // compute it for sizes a fuzzing process can hold.
  if (c.head_dim > (1 << 16)) return;
  const std::vector<float> inv = RopeInverseFrequencies(c);
  FUZZ_CHECK(static_cast<int>(inv.size()) == c.head_dim / 2, shape);
  for (size_t i = 0; i < inv.size(); ++i) {
    FUZZ_CHECK(
        std::isfinite(inv[i]) && inv[i] >= 0,
        absl::StrCat("inverse frequency ", i, " is ", inv[i], "; theta ", c.rope_theta, " ", rope));
  }
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<treespec::ModelConfig> config =
      treespec::ParseModelConfig(std::string(reinterpret_cast<const char*>(data), size));
  if (config.ok()) treespec::CheckConfig(*config);
  return 0;
}
