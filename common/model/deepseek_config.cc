#include "common/model/deepseek_config.h"

#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/config_fields.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

using config_fields::FieldReader;
using config_fields::Invalid;
using config_fields::Json;
using config_fields::Unsupported;

// A string field that, when present, must be `expected`: fields of DeepSeek's own model code
// that Transformers' DeepseekV3 ignores because it implements only this value.
absl::Status RequireIfPresent(const FieldReader& r, absl::string_view key,
                              absl::string_view expected, absl::string_view what) {
  ASSIGN_OR_RETURN(std::optional<std::string> v, r.OptionalString(key));
  if (v.has_value() && *v != expected) {
    return Unsupported(key, absl::StrCat("'", *v, "' is not supported (only '", expected, "': ",
                                         what, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseMla(const FieldReader& r, ModelConfig& c) {
  MlaConfig& m = c.mla;
  ASSIGN_OR_RETURN(std::optional<int64_t> q_lora, r.OptionalInt("q_lora_rank"));
  if (q_lora.has_value()) {
    ASSIGN_OR_RETURN(m.q_lora_rank, r.PositiveInt("q_lora_rank"));
  }
  ASSIGN_OR_RETURN(m.kv_lora_rank, r.PositiveInt("kv_lora_rank"));
  ASSIGN_OR_RETURN(m.qk_nope_head_dim, r.PositiveInt("qk_nope_head_dim"));
  ASSIGN_OR_RETURN(m.qk_rope_head_dim, r.PositiveInt("qk_rope_head_dim"));
  ASSIGN_OR_RETURN(m.v_head_dim, r.PositiveInt("v_head_dim"));
  if (m.qk_rope_head_dim % 2 != 0) {
    return Invalid("qk_rope_head_dim",
                   absl::StrCat("must be even for rotary embeddings, got ", m.qk_rope_head_dim));
  }
  ASSIGN_OR_RETURN(m.rope_interleave, r.BoolOr("rope_interleave", true));
  // DeepseekV3Config sets head_dim to the rotary part (whatever config.json says): the RoPE
  // tables are that wide.
  c.head_dim = m.qk_rope_head_dim;

  // Every head has its own keys and values (decompressed from the shared latent), so
  // Transformers' key/value head count must be the query head count.
  ASSIGN_OR_RETURN(c.num_kv_heads, r.PositiveIntOr("num_key_value_heads", c.num_q_heads));
  if (c.num_kv_heads != c.num_q_heads) {
    return Unsupported("num_key_value_heads",
                       absl::StrCat(c.num_kv_heads, " differs from num_attention_heads (",
                                    c.num_q_heads, "); MLA has one key and value per query head"));
  }

  // Softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)² under YaRN.
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kYarn) {
    if (rs.mscale_all_dim != 0.0f) {
      const double mscale = YarnMscale(rs.factor, rs.mscale_all_dim);
      scale *= mscale * mscale;
    }
  } else {
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      const Json* rope = r.Find(key);
      if (rope == nullptr || !rope->is_object()) continue;
      auto it = rope->find("mscale_all_dim");
      if (it != rope->end() && it->is_number() && it->get<double>() != 0.0) {
        return Unsupported(absl::StrCat(key, ".mscale_all_dim"),
                           "is supported only with rope_type yarn");
      }
    }
  }
  // An extreme factor or mscale_all_dim can take the squared correction out of float range.
  ASSIGN_OR_RETURN(m.softmax_scale, config_fields::AsFloat("rope_scaling.mscale_all_dim", scale));
  if (!(m.softmax_scale > 0.0f)) {
    return Invalid("rope_scaling.mscale_all_dim",
                   absl::StrCat("gives a softmax scale of ", scale, "; it must be positive"));
  }
  c.attention = AttentionKind::kMla;
  return absl::OkStatus();
}

absl::Status ParseMoe(const FieldReader& r, ModelConfig& c) {
  MoeConfig& e = c.moe;
  ASSIGN_OR_RETURN(e.first_dense_layers, r.NonNegativeInt("first_k_dense_replace"));
  if (e.first_dense_layers >= c.num_layers) return absl::OkStatus();  // a dense model
  ASSIGN_OR_RETURN(e.num_experts, r.PositiveInt("n_routed_experts"));
  ASSIGN_OR_RETURN(e.num_shared_experts, r.NonNegativeInt("n_shared_experts"));
  ASSIGN_OR_RETURN(e.experts_per_token, r.PositiveInt("num_experts_per_tok"));
  ASSIGN_OR_RETURN(e.expert_intermediate_size, r.PositiveInt("moe_intermediate_size"));
  ASSIGN_OR_RETURN(e.num_groups, r.PositiveInt("n_group"));
  ASSIGN_OR_RETURN(e.topk_groups, r.PositiveInt("topk_group"));
  ASSIGN_OR_RETURN(double scaling, r.RequiredNumber("routed_scaling_factor"));
  ASSIGN_OR_RETURN(e.routed_scaling_factor,
                   config_fields::AsFloat("routed_scaling_factor", scaling));
  if (!(e.routed_scaling_factor > 0.0f)) {
    return Invalid("routed_scaling_factor", absl::StrCat("must be positive, got ", scaling));
  }
  ASSIGN_OR_RETURN(e.norm_topk_prob, r.BoolOr("norm_topk_prob", true));

  if (e.num_experts % e.num_groups != 0) {
    return Invalid("n_group", absl::StrCat(e.num_groups, " does not divide n_routed_experts (",
                                           e.num_experts, ")"));
  }
  const int group_size = e.num_experts / e.num_groups;
  if (group_size < 2) {
    return Invalid("n_group", absl::StrCat("groups of ", group_size,
                                           " expert(s): a group is scored by its top 2"));
  }
  if (e.topk_groups > e.num_groups) {
    return Invalid("topk_group",
                   absl::StrCat(e.topk_groups, " exceeds n_group (", e.num_groups, ")"));
  }
  if (e.experts_per_token > e.topk_groups * group_size) {
    return Invalid("num_experts_per_tok",
                   absl::StrCat(e.experts_per_token, " exceeds the ", e.topk_groups * group_size,
                                " experts of the topk_group (", e.topk_groups, ") kept groups"));
  }
  RETURN_IF_ERROR(RequireIfPresent(r, "scoring_func", "sigmoid", "sigmoid router scores"));
  RETURN_IF_ERROR(RequireIfPresent(r, "topk_method", "noaux_tc",
                                   "bias-corrected group-limited top-k"));
  ASSIGN_OR_RETURN(std::optional<int64_t> freq, r.OptionalInt("moe_layer_freq"));
  if (freq.has_value() && *freq != 1) {
    return Unsupported("moe_layer_freq",
                       absl::StrCat(*freq, " is not supported (only 1: every layer from "
                                           "first_k_dense_replace on is MoE)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseDeepseekV3(const Json& root, ModelConfig& c) {
  const FieldReader r(root, "");
  ASSIGN_OR_RETURN(std::optional<std::string> type, r.OptionalString("model_type"));
  if (type.has_value() && *type != "deepseek_v3" && *type != "kimi_k2") {
    return Unsupported("model_type",
                       absl::StrCat("'", *type, "' is not supported with DeepseekV3ForCausalLM "
                                                "(supported: deepseek_v3, kimi_k2)"));
  }
  RETURN_IF_ERROR(ParseMla(r, c));
  RETURN_IF_ERROR(ParseMoe(r, c));
  ASSIGN_OR_RETURN(std::optional<int64_t> mtp, r.OptionalInt("num_nextn_predict_layers"));
  if (mtp.has_value()) {
    ASSIGN_OR_RETURN(c.num_mtp_layers, r.NonNegativeInt("num_nextn_predict_layers"));
  }
  return absl::OkStatus();
}

}  // namespace treespec
