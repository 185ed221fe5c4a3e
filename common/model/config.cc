// Parsing of Hugging Face config.json for the Llama family. Defaults follow the transformers
// config classes (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config) except where those
// defaults are fixed constants unrelated to the rest of the config (Mistral/Qwen kv heads,
// Qwen3 head_dim): there the field is required, so a sparse config cannot load silently wrong.
#include "common/model/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numbers>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/config_fields.h"
#include "common/model/deepseek_config.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using config_fields::AsFloat;
using config_fields::FieldReader;
using config_fields::Invalid;
using config_fields::Json;
using config_fields::Unsupported;

constexpr const char* kSupportedArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                                   "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                                   "DeepseekV3ForCausalLM"};

absl::StatusOr<std::vector<int>> TokenIds(const FieldReader& r, absl::string_view key) {
  const Json* v = r.Find(key);
  std::vector<int> ids;
  if (v == nullptr) return ids;
  auto add = [&](const Json& e) -> absl::Status {
    // An id past int32 would wrap to some other token.
    const bool is_int32 = e.is_number_unsigned()
                              ? e.get<uint64_t>() <= uint64_t{std::numeric_limits<int32_t>::max()}
                              : e.is_number_integer() &&
                                    e.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                    e.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!is_int32) {
      return Invalid(r.Name(key),
                     absl::StrCat("expected a token id or a list of them, got ", v->dump()));
    }
    ids.push_back(static_cast<int>(e.get<int64_t>()));
    return absl::OkStatus();
  };
  if (v->is_array()) {
    for (const Json& e : *v) RETURN_IF_ERROR(add(e));
  } else {
    RETURN_IF_ERROR(add(*v));
  }
  return ids;
}

// Parses `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5) into `config`.
absl::Status ParseRope(const Json& root, ModelConfig& config) {
  const FieldReader top(root, "");
  const Json* params = top.Find("rope_parameters");
  const Json* scaling = params != nullptr ? params : top.Find("rope_scaling");
  const std::string prefix = params != nullptr ? "rope_parameters" : "rope_scaling";
  if (scaling != nullptr && !scaling->is_object()) {
    return Invalid(prefix, absl::StrCat("expected an object or null, got ", scaling->dump()));
  }
  // transformers 5 writes both spellings; if a hand edit made them disagree, neither is safe.
  if (const Json* old = top.Find("rope_scaling"); params != nullptr && old != nullptr) {
    if (!old->is_object()) {
      return Invalid("rope_scaling", absl::StrCat("expected an object or null, got ", old->dump()));
    }
    for (const auto& [key, value] : old->items()) {
      const std::string new_key = key == "type" ? "rope_type" : key;
      auto it = params->find(new_key);
      const bool same = it != params->end() && (value.is_number() && it->is_number()
                                                    ? value.get<double>() == it->get<double>()
                                                    : value == *it);
      if (!same) {
        return Invalid(absl::StrCat("rope_scaling.", key),
                       absl::StrCat(value.dump(), " disagrees with rope_parameters.", new_key, " (",
                                    it == params->end() ? "absent" : it->dump(), ")"));
      }
    }
  }

  double theta = 10000.0;  // every supported config class defaults to 1e4
  ASSIGN_OR_RETURN(theta, top.NumberOr("rope_theta", theta));
  std::string theta_field = "rope_theta";
  if (scaling != nullptr) {
    FieldReader s(*scaling, prefix + ".");
    if (s.Has("rope_theta")) {
      ASSIGN_OR_RETURN(theta, s.NumberOr("rope_theta", theta));
      theta_field = s.Name("rope_theta");
    }
  }
  ASSIGN_OR_RETURN(config.rope_theta, AsFloat(theta_field, theta));
  if (!(config.rope_theta > 1.0f)) {
    return Invalid(theta_field, absl::StrCat("must be a number > 1, got ", theta));
  }

  // Partial rotary embeddings (rotating only part of each head) are not implemented.
  auto check_partial = [](const FieldReader& r) -> absl::Status {
    ASSIGN_OR_RETURN(std::optional<double> partial, r.OptionalNumber("partial_rotary_factor"));
    if (partial.has_value() && *partial != 1.0) {
      return Unsupported(r.Name("partial_rotary_factor"),
                         absl::StrCat(*partial, " is not supported (only 1.0: full rotary)"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check_partial(top));
  if (scaling != nullptr) RETURN_IF_ERROR(check_partial(FieldReader(*scaling, prefix + ".")));

  config.rope_scaling = RopeScaling();
  if (scaling == nullptr) return absl::OkStatus();
  const FieldReader s(*scaling, prefix + ".");
  ASSIGN_OR_RETURN(std::optional<std::string> type, s.OptionalString("rope_type"));
  std::string type_field = s.Name("rope_type");
  if (!type.has_value()) {
    ASSIGN_OR_RETURN(type, s.OptionalString("type"));  // the older spelling
    if (type.has_value()) type_field = s.Name("type");
  }
  const std::string t = type.value_or("default");
  RopeScaling& rs = config.rope_scaling;
  if (t == "default") return absl::OkStatus();

  auto positive = [&](absl::string_view key, bool required,
                      double fallback) -> absl::StatusOr<double> {
    double v = fallback;
    if (required) {
      ASSIGN_OR_RETURN(v, s.RequiredNumber(key));
    } else {
      ASSIGN_OR_RETURN(v, s.NumberOr(key, fallback));
    }
    ASSIGN_OR_RETURN(const float narrowed, AsFloat(s.Name(key), v));
    if (!(narrowed > 0.0f)) {
      return Invalid(s.Name(key), absl::StrCat("must be a positive number, got ", v));
    }
    return v;  // the double: YaRN's attention factor is computed from it, as transformers does
  };

  if (t == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    ASSIGN_OR_RETURN(double factor, positive("factor", true, 1.0));
    rs.factor = static_cast<float>(factor);
    return absl::OkStatus();
  }
  if (t == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(double factor, positive("factor", true, 1.0));
    ASSIGN_OR_RETURN(double low, positive("low_freq_factor", true, 1.0));
    ASSIGN_OR_RETURN(double high, positive("high_freq_factor", true, 4.0));
    ASSIGN_OR_RETURN(int original, s.PositiveInt("original_max_position_embeddings"));
    rs.factor = static_cast<float>(factor);
    rs.low_freq_factor = static_cast<float>(low);
    rs.high_freq_factor = static_cast<float>(high);
    // Compared as floats: RopeInverseFrequencies divides by their difference.
    if (!(rs.high_freq_factor > rs.low_freq_factor)) {
      return Invalid(s.Name("high_freq_factor"),
                     absl::StrCat("must be greater than low_freq_factor (", low, "), got ", high));
    }
    rs.original_max_position_embeddings = original;
    return absl::OkStatus();
  }
  if (t == "yarn") {
    // As transformers' _compute_yarn_parameters (after the fix that keeps an explicit factor).
    rs.type = RopeScaling::Type::kYarn;
    ASSIGN_OR_RETURN(double factor, positive("factor", true, 1.0));
    rs.factor = static_cast<float>(factor);
    // Python `x or default` semantics: 0 and null both mean "use the default".
    ASSIGN_OR_RETURN(double beta_fast, s.NumberOr("beta_fast", 0.0));
    ASSIGN_OR_RETURN(double beta_slow, s.NumberOr("beta_slow", 0.0));
    ASSIGN_OR_RETURN(rs.beta_fast,
                     AsFloat(s.Name("beta_fast"), beta_fast != 0.0 ? beta_fast : 32.0));
    ASSIGN_OR_RETURN(rs.beta_slow,
                     AsFloat(s.Name("beta_slow"), beta_slow != 0.0 ? beta_slow : 1.0));
    if (!(rs.beta_fast > 0.0f) || !(rs.beta_slow > 0.0f)) {
      return Invalid(s.Name("beta_fast"), "beta_fast and beta_slow must be positive");
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> original,
                     s.OptionalInt("original_max_position_embeddings"));
    if (original.has_value() && (*original < 0 || *original > (int64_t{1} << 30))) {
      return Invalid(
          s.Name("original_max_position_embeddings"),
          absl::StrCat("must be in [0, 2^30] (0: max_position_embeddings), got ", *original));
    }
    rs.original_max_position_embeddings = (original.has_value() && *original > 0)
                                              ? static_cast<int>(*original)
                                              : config.max_position_embeddings;
    ASSIGN_OR_RETURN(std::optional<double> attention_factor, s.OptionalNumber("attention_factor"));
    ASSIGN_OR_RETURN(double mscale, s.NumberOr("mscale", 0.0));
    ASSIGN_OR_RETURN(double mscale_all_dim, s.NumberOr("mscale_all_dim", 0.0));
    ASSIGN_OR_RETURN(rs.mscale, AsFloat(s.Name("mscale"), mscale));
    ASSIGN_OR_RETURN(rs.mscale_all_dim, AsFloat(s.Name("mscale_all_dim"), mscale_all_dim));
    double af;
    if (attention_factor.has_value()) {
      af = *attention_factor;
    } else if (mscale != 0.0 && mscale_all_dim != 0.0) {
      af = YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim);
    } else {
      af = YarnMscale(factor, 1.0);
    }
    ASSIGN_OR_RETURN(rs.attention_factor, AsFloat(s.Name("attention_factor"), af));
    if (!(rs.attention_factor > 0.0f)) {
      return Invalid(s.Name("attention_factor"), absl::StrCat("must be positive, got ", af));
    }
    ASSIGN_OR_RETURN(bool truncate, s.BoolOr("truncate", true));
    if (!truncate) {
      return Unsupported(s.Name("truncate"),
                         "false is not supported (YaRN correction range is "
                         "always truncated to whole dimensions)");
    }
    return absl::OkStatus();
  }
  return Unsupported(type_field, absl::StrCat("'", t,
                                              "' is not supported (supported: default, "
                                              "linear, llama3, yarn)"));
}

// Sliding-window attention is not implemented: refuse configs whose window is narrower than
// the context we would serve.
absl::Status CheckNoSlidingWindow(const FieldReader& r, const ModelConfig& c) {
  const bool is_mistral = c.architecture == "MistralForCausalLM";
  const bool is_qwen = c.architecture == "Qwen2ForCausalLM" || c.architecture == "Qwen3ForCausalLM";
  if (!is_mistral && !is_qwen) return absl::OkStatus();  // LlamaConfig has no sliding window

  if (const Json* types = r.Find("layer_types"); types != nullptr) {
    if (!types->is_array()) return Invalid("layer_types", "expected a list");
    for (const Json& t : *types) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        return Unsupported("layer_types",
                           absl::StrCat("only full_attention layers are supported, got ", t.dump(),
                                        " (sliding-window attention is not implemented)"));
      }
    }
  }

  // An absent key takes the config classes' default (4096); an explicit null means no window.
  std::optional<int64_t> window;
  if (!r.Contains("sliding_window")) {
    window = 4096;
  } else {
    ASSIGN_OR_RETURN(window, r.OptionalInt("sliding_window"));
  }
  if (!window.has_value() || *window >= c.max_position_embeddings) return absl::OkStatus();
  const std::string why = absl::StrCat(
      "sliding window ", *window, r.Contains("sliding_window") ? "" : " (the default when absent)",
      " is narrower than max_position_embeddings (", c.max_position_embeddings,
      "); sliding-window attention is not implemented");
  if (is_mistral) return Unsupported("sliding_window", why);

  // Qwen2/Qwen3 use the window only with use_sliding_window, and only from layer
  // max_window_layers on.
  ASSIGN_OR_RETURN(bool use, r.BoolOr("use_sliding_window", false));
  if (!use) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers, r.OptionalInt("max_window_layers"));
  if (max_window_layers.value_or(28) >= c.num_layers) return absl::OkStatus();
  return Unsupported("use_sliding_window", why);
}

// The query and KV heads of a GQA model and their width.
absl::Status ParseGqaHeads(const FieldReader& r, ModelConfig& c) {
  const bool llama = c.architecture == "LlamaForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  if (llama) {
    // LlamaConfig: None -> num_attention_heads (multi-head attention).
    ASSIGN_OR_RETURN(c.num_kv_heads, r.PositiveIntOr("num_key_value_heads", c.num_q_heads));
  } else {
    // MistralConfig/Qwen2Config/Qwen3Config default to a fixed 8 or 32; require it instead.
    ASSIGN_OR_RETURN(c.num_kv_heads, r.PositiveInt("num_key_value_heads"));
  }
  if (c.num_q_heads % c.num_kv_heads != 0) {
    return Invalid(
        "num_key_value_heads",
        absl::StrCat(c.num_kv_heads, " does not divide num_attention_heads (", c.num_q_heads, ")"));
  }
  if (r.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, r.PositiveInt("head_dim"));
  } else if (qwen3) {
    // Qwen3Config defaults head_dim to 128 regardless of hidden_size; require it instead.
    return Invalid("head_dim", "required field is missing (Qwen3 sets head_dim explicitly)");
  } else {
    if (c.hidden_size % c.num_q_heads != 0) {
      return Invalid("head_dim", absl::StrCat("absent, and hidden_size (", c.hidden_size,
                                              ") is not a multiple of num_attention_heads (",
                                              c.num_q_heads, ")"));
    }
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  if (c.head_dim % 2 != 0) {
    return Invalid("head_dim",
                   absl::StrCat("must be even for rotary embeddings, got ", c.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

LayerSpec LayerSpecOf(const ModelConfig& config, int layer) {
  const bool moe = config.moe.num_experts > 0 && layer >= config.moe.first_dense_layers;
  return LayerSpec{config.attention, moe ? MlpKind::kMoe : MlpKind::kDense};
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  const FieldReader r(root, "");
  ModelConfig c;

  const std::string supported = absl::StrJoin(kSupportedArchitectures, ", ");
  const Json* archs = r.Find("architectures");
  if (archs == nullptr) {
    return Invalid("architectures",
                   absl::StrCat("required field is missing (supported: ", supported, ")"));
  }
  if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
    return Invalid("architectures", absl::StrCat("expected a list of one architecture name, got ",
                                                 archs->dump(), " (supported: ", supported, ")"));
  }
  c.architecture = (*archs)[0].get<std::string>();
  if (std::find(std::begin(kSupportedArchitectures), std::end(kSupportedArchitectures),
                c.architecture) == std::end(kSupportedArchitectures)) {
    return Unsupported(
        "architectures",
        absl::StrCat("'", c.architecture, "' is not supported (supported: ", supported, ")"));
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool deepseek = c.architecture == "DeepseekV3ForCausalLM";

  ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, r.PositiveInt("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_q_heads, r.PositiveInt("num_attention_heads"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, r.PositiveInt("max_position_embeddings"));

  if (!deepseek) RETURN_IF_ERROR(ParseGqaHeads(r, c));
  ASSIGN_OR_RETURN(double eps, r.NumberOr("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rms_norm_eps, AsFloat("rms_norm_eps", eps));
  if (!(c.rms_norm_eps > 0.0f)) {
    return Invalid("rms_norm_eps", absl::StrCat("must be positive, got ", eps));
  }
  RETURN_IF_ERROR(ParseRope(root, c));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, r.BoolOr("tie_word_embeddings", false));

  ASSIGN_OR_RETURN(std::optional<std::string> act, r.OptionalString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return Unsupported("hidden_act", absl::StrCat("'", *act, "' is not supported (only silu)"));
  }
  // Qwen2 always has q/k/v biases (and no attention_bias field); elsewhere attention_bias adds
  // an o_proj bias too, which our weights do not carry.
  c.qkv_bias = qwen2;
  if (!qwen2) {
    ASSIGN_OR_RETURN(bool attention_bias, r.BoolOr("attention_bias", false));
    if (attention_bias) {
      return Unsupported("attention_bias", "true is not supported (q/k/v/o projection biases)");
    }
  }
  ASSIGN_OR_RETURN(bool mlp_bias, r.BoolOr("mlp_bias", false));
  if (mlp_bias) return Unsupported("mlp_bias", "true is not supported (MLP projection biases)");
  c.qk_norm = qwen3;
  RETURN_IF_ERROR(CheckNoSlidingWindow(r, c));
  if (const Json* q = r.Find("quantization_config"); q != nullptr) {
    // DeepSeek-V3 ships FP8 with 128×128 block scales, Kimi-K2 variants INT4: serve a bf16 or
    // fp32 conversion instead.
    const std::string method =
        q->is_object() && q->contains("quant_method") ? q->at("quant_method").dump() : "unknown";
    return Unsupported("quantization_config",
                       absl::StrCat("quantized checkpoints are not supported (quant_method ",
                                    method, "); convert the weights to bf16, f16 or f32"));
  }

  if (deepseek) RETURN_IF_ERROR(ParseDeepseekV3(root, c));

  ASSIGN_OR_RETURN(std::vector<int> bos, TokenIds(r, "bos_token_id"));
  if (bos.size() > 1) return Invalid("bos_token_id", "expected a single token id");
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  ASSIGN_OR_RETURN(c.eos_token_ids, TokenIds(r, "eos_token_id"));
  return c;
}

absl::StatusOr<std::string> ReadConfigJson(const std::string& dir, absl::string_view what) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno),
                                            "); is '", dir, "' ", what, "?"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text.str();
}

absl::Status NameConfigFile(const absl::Status& status, const std::string& dir) {
  if (status.ok()) return status;
  // "config.json field `x`: ..." -> "<dir>/config.json: field `x`: ..."
  absl::string_view message = status.message();
  absl::ConsumePrefix(&message, "config.json ");
  return absl::Status(status.code(), absl::StrCat(dir, "/config.json: ", message));
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  absl::StatusOr<std::string> text = ReadConfigJson(model_dir, "a model directory");
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*text);
  if (!config.ok()) return NameConfigFile(config.status(), model_dir);
  return config;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& config) {
  // Computed in double and rounded once; transformers computes in fp32, so the two agree to
  // about an ulp.
  const int dim = config.head_dim;
  const int half = dim / 2;
  const double base = config.rope_theta;
  const RopeScaling& rs = config.rope_scaling;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, (2.0 * i) / dim);

  switch (rs.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (double& f : inv) f /= rs.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      // Llama 3.1: keep high frequencies, divide low ones by `factor`, and blend in between
      // by where the wavelength falls relative to the original context.
      const double old_context = rs.original_max_position_embeddings;
      const double low_freq_wavelen = old_context / rs.low_freq_factor;
      const double high_freq_wavelen = old_context / rs.high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= rs.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth = (old_context / wavelen - rs.low_freq_factor) /
                                (static_cast<double>(rs.high_freq_factor) - rs.low_freq_factor);
          f = (1.0 - smooth) * f / rs.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::Type::kYarn: {
      // YaRN: interpolate (divide by factor) the dimensions that rotate fewer than beta_slow
      // times over the original context, extrapolate (keep) those rotating more than
      // beta_fast times, and ramp linearly in between.
      const double original = rs.original_max_position_embeddings > 0
                                  ? rs.original_max_position_embeddings
                                  : config.max_position_embeddings;
      auto correction_dim = [&](double rotations) {
        return (dim * std::log(original / (rotations * 2.0 * std::numbers::pi))) /
               (2.0 * std::log(base));
      };
      double low = std::max(std::floor(correction_dim(rs.beta_fast)), 0.0);
      double high = std::min(std::ceil(correction_dim(rs.beta_slow)), dim - 1.0);
      if (low == high) high += 0.001;  // avoid dividing by zero
      for (int i = 0; i < half; ++i) {
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;
        const double interpolated = inv[i] / rs.factor;
        inv[i] = interpolated * (1.0 - extrapolation) + inv[i] * extrapolation;
      }
      break;
    }
  }
  return std::vector<float>(inv.begin(), inv.end());
}

}  // namespace treespec
