#include "common/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Abridged from the published config.json files of each model.
constexpr char kLlama31_8B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kLlama2_7B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kMistral7Bv03[] = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "vocab_size": 32768
})";

constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen3_8B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// transformers 5 folds rope_theta and the scaling into `rope_parameters`.
constexpr char kLlamaTransformers5[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "vocab_size": 128256,
  "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": 128001,
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}
})";

// DeepSeek-V3's published config.json (FP8), abridged; kDeepseekV3Bf16 is its bf16
// conversion (no quantization_config).
constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

// Kimi-K2's config.json, abridged, without its quantization_config.
constexpr char kKimiK2[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 163584,
  "eos_token_id": 163585,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 131072,
  "model_type": "kimi_k2",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 384,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 64,
  "num_nextn_predict_layers": 0,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 50000.0,
  "routed_scaling_factor": 2.827,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "v_head_dim": 128,
  "vocab_size": 163840
})";

std::string Replace(const char* base, const std::string& from, const std::string& to) {
  std::string s = base;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ParseModelConfigTest, Llama31) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31_8B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(c->num_q_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(c->rope_scaling.attention_factor, 1.0f);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ParseModelConfigTest, Llama2DefaultsKvHeadsAndHeadDim) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama2_7B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 32);            // absent -> num_attention_heads
  EXPECT_EQ(c->head_dim, 128);               // hidden / heads
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);  // LlamaConfig default
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
}

TEST(ParseModelConfigTest, Mistral) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMistral7Bv03);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
}

TEST(ParseModelConfigTest, Qwen2HasQkvBiasAndUnusedWindow) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen25_05B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
}

TEST(ParseModelConfigTest, Qwen3HasQkNorm) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3_8B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);  // an integer in the file
}

TEST(ParseModelConfigTest, Transformers5RopeParameters) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlamaTransformers5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_TRUE(c->tie_word_embeddings);

  // transformers 5 also keeps the old spelling alongside; agreeing copies are fine.
  const std::string both =
      Replace(kLlamaTransformers5, R"("rope_parameters")",
              R"("rope_scaling": {"type": "llama3", "factor": 32, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
         "rope_parameters")");
  ASSERT_TRUE(ParseModelConfig(both).ok()) << ParseModelConfig(both).status();

  const std::string plain = absl::StrReplaceAll(
      kLlamaTransformers5, {{R"("rope_type": "llama3")", R"("rope_type": "default")"}});
  c = ParseModelConfig(plain);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
}

TEST(ParseModelConfigTest, OldRopeScalingTypeSpelling) {
  const std::string text = absl::StrReplaceAll(
      kLlama2_7B,
      {{R"("rope_scaling": null)", R"("rope_scaling": {"type": "linear", "factor": 2.0})"}});
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 2.0f);
}

TEST(ParseModelConfigTest, YarnAttentionFactor) {
  auto with_scaling = [](const std::string& scaling) {
    return ParseModelConfig(absl::StrReplaceAll(
        kQwen3_8B, {{R"("rope_scaling": null)", "\"rope_scaling\": " + scaling}}));
  };
  absl::StatusOr<ModelConfig> c = with_scaling(
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 4.0f);  // explicit factor wins over 40960 / 32768
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_FLOAT_EQ(c->rope_scaling.attention_factor, 0.1f * std::log(4.0f) + 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.beta_slow, 1.0f);

  c = with_scaling(R"({"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0,
                       "beta_fast": 16, "beta_slow": 2})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->rope_scaling.attention_factor, 0.9210423553163399, 1e-6);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 40960);  // absent: max_position
  EXPECT_FLOAT_EQ(c->rope_scaling.beta_fast, 16.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.beta_slow, 2.0f);

  c = with_scaling(R"({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_scaling.attention_factor, 1.5f);
}

const std::string kDeepseekV3Bf16 = Replace(
    kDeepseekV3,
    R"(  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
)",
    "");

TEST(ParseModelConfigTest, DeepseekV3) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kDeepseekV3Bf16);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention, AttentionKind::kMla);
  EXPECT_EQ(c->num_q_heads, 128);
  EXPECT_EQ(c->num_kv_heads, 128);
  EXPECT_EQ(c->head_dim, 64);  // the rotary part, as DeepseekV3Config sets head_dim
  EXPECT_EQ(c->mla.q_lora_rank, 1536);
  EXPECT_EQ(c->mla.kv_lora_rank, 512);
  EXPECT_EQ(c->mla.qk_head_dim(), 192);
  EXPECT_EQ(c->mla.latent_width(), 576);
  EXPECT_EQ(c->mla.v_head_dim, 128);
  EXPECT_TRUE(c->mla.rope_interleave);  // Transformers' default
  // YaRN: mscale == mscale_all_dim, so cos/sin are unscaled and the softmax takes
  // (0.1 ln 40 + 1)² / sqrt(192).
  EXPECT_FLOAT_EQ(c->rope_scaling.attention_factor, 1.0f);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_FLOAT_EQ(c->mla.softmax_scale, static_cast<float>(m * m / std::sqrt(192.0)));
  EXPECT_EQ(c->moe.num_experts, 256);
  EXPECT_EQ(c->moe.num_shared_experts, 1);
  EXPECT_EQ(c->moe.experts_per_token, 8);
  EXPECT_EQ(c->moe.num_groups, 8);
  EXPECT_EQ(c->moe.topk_groups, 4);
  EXPECT_EQ(c->moe.expert_intermediate_size, 2048);
  EXPECT_FLOAT_EQ(c->moe.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->num_mtp_layers, 1);
  EXPECT_EQ(LayerSpecOf(*c, 2).mlp, MlpKind::kDense);
  EXPECT_EQ(LayerSpecOf(*c, 3).mlp, MlpKind::kMoe);
  EXPECT_EQ(LayerSpecOf(*c, 60).attention, AttentionKind::kMla);

  // q_lora_rank null: a direct q_proj. Without rope_scaling the scale is qk_head_dim^-0.5.
  c = ParseModelConfig(
      absl::StrReplaceAll(kDeepseekV3Bf16, {{R"("q_lora_rank": 1536)", R"("q_lora_rank": null)"},
                                            {R"("rope_scaling": {)", R"("unused_rope": {)"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_FLOAT_EQ(c->mla.softmax_scale, static_cast<float>(1.0 / std::sqrt(192.0)));
}

TEST(ParseModelConfigTest, KimiK2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kKimiK2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention, AttentionKind::kMla);
  EXPECT_EQ(c->moe.num_experts, 384);
  EXPECT_EQ(c->moe.num_groups, 1);
  EXPECT_FLOAT_EQ(c->moe.routed_scaling_factor, 2.827f);
  EXPECT_EQ(c->num_mtp_layers, 0);
  EXPECT_EQ(LayerSpecOf(*c, 0).mlp, MlpKind::kDense);
  EXPECT_EQ(LayerSpecOf(*c, 1).mlp, MlpKind::kMoe);
  EXPECT_FLOAT_EQ(c->rope_theta, 50000.0f);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{163585});
}

// Every error names the offending field.
struct ErrorCase {
  const char* name;
  std::string json;
  std::string field;  // must appear in the message
  std::string also;   // another substring that must appear ("" for none)
};

void PrintTo(const ErrorCase& e, std::ostream* os) { *os << e.name; }

class ConfigErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ConfigErrorTest, NamesTheField) {
  const ErrorCase& e = GetParam();
  absl::StatusOr<ModelConfig> c = ParseModelConfig(e.json);
  ASSERT_FALSE(c.ok()) << e.name;
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("`" + e.field + "`")) << c.status();
  if (!e.also.empty()) {
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(e.also));
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigErrorTest,
    ::testing::Values(
        ErrorCase{"NoArchitectures",
                  Replace(kLlama2_7B, R"("architectures": ["LlamaForCausalLM"],)", ""),
                  "architectures", "missing"},
        ErrorCase{"UnknownArchitecture", Replace(kLlama2_7B, "LlamaForCausalLM", "GPT2LMHeadModel"),
                  "architectures",
                  "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"},
        ErrorCase{"ArchitecturesNotAList", Replace(kLlama2_7B, R"(["LlamaForCausalLM"])", "7"),
                  "architectures", ""},
        ErrorCase{"MissingHiddenSize", Replace(kLlama2_7B, R"("hidden_size": 4096,)", ""),
                  "hidden_size", "missing"},
        ErrorCase{"MissingVocab",
                  Replace(kLlama2_7B, R"(,
  "vocab_size": 32000)",
                          ""),
                  "vocab_size", "missing"},
        ErrorCase{"MissingLayers", Replace(kLlama2_7B, R"("num_hidden_layers": 32,)", ""),
                  "num_hidden_layers", ""},
        ErrorCase{"MissingIntermediate", Replace(kLlama2_7B, R"("intermediate_size": 11008,)", ""),
                  "intermediate_size", ""},
        ErrorCase{"MissingHeads", Replace(kLlama2_7B, R"("num_attention_heads": 32,)", ""),
                  "num_attention_heads", ""},
        ErrorCase{"MissingMaxPosition",
                  Replace(kLlama2_7B, R"("max_position_embeddings": 4096,)", ""),
                  "max_position_embeddings", ""},
        ErrorCase{"HiddenSizeString",
                  Replace(kLlama2_7B, R"("hidden_size": 4096)", R"("hidden_size": "4096")"),
                  "hidden_size", "integer"},
        ErrorCase{
            "NegativeHeads",
            Replace(kLlama2_7B, R"("num_attention_heads": 32)", R"("num_attention_heads": -4)"),
            "num_attention_heads", ""},
        ErrorCase{
            "KvHeadsDoNotDivide",
            Replace(kMistral7Bv03, R"("num_key_value_heads": 8)", R"("num_key_value_heads": 5)"),
            "num_key_value_heads", ""},
        ErrorCase{"MistralNeedsKvHeads", Replace(kMistral7Bv03, R"("num_key_value_heads": 8,)", ""),
                  "num_key_value_heads", "missing"},
        ErrorCase{"Qwen3NeedsHeadDim", Replace(kQwen3_8B, R"("head_dim": 128,)", ""), "head_dim",
                  "missing"},
        ErrorCase{"HeadDimNotDerivable",
                  Replace(kLlama2_7B, R"("hidden_size": 4096)", R"("hidden_size": 4000)"),
                  "head_dim", ""},
        ErrorCase{"DynamicRope",
                  Replace(kLlama2_7B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"),
                  "rope_scaling.rope_type", "dynamic"},
        ErrorCase{"LongRopeOldSpelling",
                  Replace(kLlama2_7B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"type": "longrope", "factor": 2.0})"),
                  "rope_scaling.type", "longrope"},
        ErrorCase{
            "DynamicRopeParameters",
            Replace(kLlamaTransformers5, R"("rope_type": "llama3")", R"("rope_type": "dynamic")"),
            "rope_parameters.rope_type", "dynamic"},
        ErrorCase{
            "RopeScalingDisagreesWithRopeParameters",
            Replace(kLlamaTransformers5, R"("rope_parameters")",
                    R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_parameters")"),
            "rope_scaling.factor", "rope_parameters.factor"},
        ErrorCase{"Llama3MissingLowFreq", Replace(kLlama31_8B, R"("low_freq_factor": 1.0,)", ""),
                  "rope_scaling.low_freq_factor", "missing"},
        ErrorCase{"Llama3MissingOriginal",
                  Replace(kLlama31_8B, R"("original_max_position_embeddings": 8192,)", ""),
                  "rope_scaling.original_max_position_embeddings", ""},
        ErrorCase{"LinearMissingFactor",
                  Replace(kLlama2_7B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"rope_type": "linear"})"),
                  "rope_scaling.factor", "missing"},
        ErrorCase{"RopeScalingNotObject",
                  Replace(kLlama2_7B, R"("rope_scaling": null)", R"("rope_scaling": 2.0)"),
                  "rope_scaling", ""},
        ErrorCase{
            "YarnNoTruncate",
            Replace(kQwen3_8B, R"("rope_scaling": null)",
                    R"("rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": false})"),
            "rope_scaling.truncate", ""},
        ErrorCase{
            "PartialRotary",
            Replace(kLlama2_7B, R"("pretraining_tp": 1,)", R"("partial_rotary_factor": 0.5,)"),
            "partial_rotary_factor", ""},
        ErrorCase{"LlamaAttentionBias",
                  Replace(kLlama31_8B, R"("attention_bias": false)", R"("attention_bias": true)"),
                  "attention_bias", ""},
        ErrorCase{"Qwen3AttentionBias",
                  Replace(kQwen3_8B, R"("attention_bias": false)", R"("attention_bias": true)"),
                  "attention_bias", ""},
        ErrorCase{"MlpBias", Replace(kLlama31_8B, R"("mlp_bias": false)", R"("mlp_bias": true)"),
                  "mlp_bias", ""},
        ErrorCase{"Gelu", Replace(kLlama2_7B, R"("hidden_act": "silu")", R"("hidden_act": "gelu")"),
                  "hidden_act", "gelu"},
        ErrorCase{"MistralSlidingWindow",
                  Replace(kMistral7Bv03, R"("sliding_window": null)", R"("sliding_window": 4096)"),
                  "sliding_window", "4096"},
        ErrorCase{"MistralDefaultSlidingWindow",
                  Replace(kMistral7Bv03, R"("sliding_window": null,)", ""), "sliding_window",
                  "default"},
        ErrorCase{
            "QwenSlidingWindowInUse",
            absl::StrReplaceAll(
                kQwen25_05B, {{R"("use_sliding_window": false)", R"("use_sliding_window": true)"},
                              {R"("sliding_window": 32768)", R"("sliding_window": 4096)"},
                              {R"("max_window_layers": 24)", R"("max_window_layers": 0)"}}),
            "use_sliding_window", ""},
        ErrorCase{
            "SlidingLayerTypes",
            Replace(
                kQwen3_8B, R"("use_cache": true,)",
                R"("use_cache": true, "layer_types": ["full_attention", "sliding_attention"],)"),
            "layer_types", ""},
        ErrorCase{"Quantized",
                  Replace(kQwen3_8B, R"("use_cache": true,)",
                          R"("use_cache": true, "quantization_config": {"quant_method": "fp8"},)"),
                  "quantization_config", ""},
        ErrorCase{"BadEos",
                  Replace(kLlama2_7B, R"("eos_token_id": 2)", R"("eos_token_id": "</s>")"),
                  "eos_token_id", ""},
        ErrorCase{"BadRmsEps",
                  Replace(kLlama2_7B, R"("rms_norm_eps": 1e-05)", R"("rms_norm_eps": 0)"),
                  "rms_norm_eps", ""},
        // The first is an input of tests/fuzz/config_fuzz (regressions/config_fuzz/): a check
        // made on the double would let through values that break as the float the model uses
        // (0, infinity, equal llama3 factors). The rest are the same mistake elsewhere, and ids
        // or lengths past int32 that would wrap.
        ErrorCase{"RmsEpsRoundsToZeroAsFloat",
                  Replace(kLlama2_7B, R"("rms_norm_eps": 1e-05)", R"("rms_norm_eps": 1e-60)"),
                  "rms_norm_eps", "positive"},
        ErrorCase{"RopeThetaBeyondFloat",
                  Replace(kLlama31_8B, R"("rope_theta": 500000.0)", R"("rope_theta": 1e39)"),
                  "rope_theta", "float range"},
        ErrorCase{
            "Llama3FactorsEqualAsFloats",
            Replace(kLlama31_8B, R"("high_freq_factor": 4.0)", R"("high_freq_factor": 1.00000001)"),
            "rope_scaling.high_freq_factor", "greater than low_freq_factor"},
        ErrorCase{"LinearFactorRoundsToZeroAsFloat",
                  Replace(kLlama2_7B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"rope_type": "linear", "factor": 1e-50})"),
                  "rope_scaling.factor", "positive"},
        ErrorCase{"YarnBetaBeyondFloat",
                  Replace(kQwen3_8B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                              "beta_fast": 1e300})"),
                  "rope_scaling.beta_fast", "float range"},
        ErrorCase{"YarnOriginalPastInt",
                  Replace(kQwen3_8B, R"("rope_scaling": null)",
                          R"("rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                              "original_max_position_embeddings": 4294967296})"),
                  "rope_scaling.original_max_position_embeddings", "4294967296"},
        ErrorCase{"DeepseekFp8", kDeepseekV3, "quantization_config", "fp8"},
        ErrorCase{"DeepseekGroupsDoNotDivide",
                  Replace(kDeepseekV3Bf16.c_str(), R"("n_group": 8)", R"("n_group": 7)"), "n_group",
                  "does not divide"},
        ErrorCase{"DeepseekTopkGroupPastGroups",
                  Replace(kDeepseekV3Bf16.c_str(), R"("topk_group": 4)", R"("topk_group": 9)"),
                  "topk_group", "exceeds n_group"},
        ErrorCase{"DeepseekTooManyExpertsPerToken",
                  Replace(kDeepseekV3Bf16.c_str(), R"("num_experts_per_tok": 8)",
                          R"("num_experts_per_tok": 129)"),
                  "num_experts_per_tok", "kept groups"},
        ErrorCase{"DeepseekSoftmaxScoring",
                  Replace(kDeepseekV3Bf16.c_str(), R"("scoring_func": "sigmoid")",
                          R"("scoring_func": "softmax")"),
                  "scoring_func", "sigmoid"},
        ErrorCase{"DeepseekKvHeads",
                  Replace(kDeepseekV3Bf16.c_str(), R"("num_key_value_heads": 128)",
                          R"("num_key_value_heads": 1)"),
                  "num_key_value_heads", "MLA"},
        ErrorCase{"DeepseekNoKvLora",
                  Replace(kDeepseekV3Bf16.c_str(), R"("kv_lora_rank": 512,)", ""), "kv_lora_rank",
                  "missing"},
        ErrorCase{"DeepseekNoFirstDense",
                  Replace(kDeepseekV3Bf16.c_str(), R"("first_k_dense_replace": 3,)", ""),
                  "first_k_dense_replace", "missing"},
        ErrorCase{"DeepseekOddRope",
                  Replace(kDeepseekV3Bf16.c_str(), R"("qk_rope_head_dim": 64)",
                          R"("qk_rope_head_dim": 63)"),
                  "qk_rope_head_dim", "even"},
        ErrorCase{"DeepseekV2ModelType",
                  Replace(kDeepseekV3Bf16.c_str(), R"("model_type": "deepseek_v3")",
                          R"("model_type": "deepseek_v2")"),
                  "model_type", "kimi_k2"},
        ErrorCase{
            "DeepseekLayerFrequency",
            Replace(kDeepseekV3Bf16.c_str(), R"("moe_layer_freq": 1)", R"("moe_layer_freq": 2)"),
            "moe_layer_freq", ""},
        ErrorCase{"DeepseekMscaleWithoutYarn",
                  Replace(kDeepseekV3Bf16.c_str(), R"("type": "yarn")", R"("type": "linear")"),
                  "rope_scaling.mscale_all_dim", "yarn"},
        ErrorCase{"DeepseekSoftmaxScaleBeyondFloat",
                  Replace(kDeepseekV3Bf16.c_str(), R"("mscale_all_dim": 1.0)",
                          R"("mscale_all_dim": 1e30)"),
                  "rope_scaling.mscale_all_dim", "float range"},
        ErrorCase{"EosPastInt32",
                  Replace(kLlama2_7B, R"("eos_token_id": 2)", R"("eos_token_id": 4294967298)"),
                  "eos_token_id", ""}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return std::string(info.param.name); });

TEST(ParseModelConfigTest, QwenWindowUnusedBelowMaxWindowLayers) {
  // use_sliding_window with every layer below max_window_layers: no layer slides.
  std::string text =
      Replace(kQwen25_05B, R"("use_sliding_window": false)", R"("use_sliding_window": true)");
  text = Replace(text.c_str(), R"("sliding_window": 32768)", R"("sliding_window": 4096)");
  EXPECT_TRUE(ParseModelConfig(text).ok());
  text = Replace(text.c_str(), R"("max_window_layers": 24)", R"("max_window_layers": 12)");
  EXPECT_FALSE(ParseModelConfig(text).ok());
}

TEST(ParseModelConfigTest, InvalidJson) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("{\"architectures\": [");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not valid JSON"));
}

class LoadModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("config_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }
  std::filesystem::path dir_;
};

TEST_F(LoadModelConfigTest, Loads) {
  Write(kQwen3_8B);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 36);
}

TEST_F(LoadModelConfigTest, MissingDirectoryNamesPath) {
  const std::string missing = (dir_ / "nope").string();
  absl::StatusOr<ModelConfig> c = LoadModelConfig(missing);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(missing + "/config.json"));
}

TEST_F(LoadModelConfigTest, MissingConfigNamesPath) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(dir_.string() + "/config.json"));
}

TEST_F(LoadModelConfigTest, ErrorNamesFileAndField) {
  Write(Replace(kLlama2_7B, R"("hidden_act": "silu")", R"("hidden_act": "relu")"));
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(dir_.string() + "/config.json"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("`hidden_act`"));
}

// ---- RoPE frequencies ------------------------------------------------------------------------

ModelConfig TinyRopeConfig(int head_dim, float theta) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = 8192;
  return c;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    // A few fp32 ulps: both sides round once from (nearly) exact values.
    EXPECT_NEAR(got[i], want[i], 4e-7 * std::abs(want[i])) << "dimension pair " << i;
  }
}

TEST(RopeInverseFrequenciesTest, Default) {
  const ModelConfig c = TinyRopeConfig(8, 10000.0f);
  // theta^(-2i/8) for i = 0..3: 1, 0.1, 0.01, 0.001.
  ExpectClose(RopeInverseFrequencies(c), {1.0, 0.1, 0.01, 0.001});
}

TEST(RopeInverseFrequenciesTest, Linear) {
  ModelConfig c = TinyRopeConfig(8, 10000.0f);
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 4.0f;
  ExpectClose(RopeInverseFrequencies(c), {0.25, 0.025, 0.0025, 0.00025});
}

TEST(RopeInverseFrequenciesTest, Llama3IndependentFormula) {
  ModelConfig c = TinyRopeConfig(16, 500000.0f);
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::kLlama3;
  rs.factor = 8.0f;
  rs.low_freq_factor = 1.0f;
  rs.high_freq_factor = 4.0f;
  rs.original_max_position_embeddings = 8192;
  // Restated in frequencies: rotations over the original context r = old_len * f / (2 pi).
  // r >= high_freq_factor: unchanged; r < low_freq_factor: f / factor; else blend by
  // s = (r - low) / (high - low): f * ((1 - s) / factor + s).
  std::vector<double> want;
  for (int i = 0; i < 8; ++i) {
    const double f = std::pow(500000.0, -i / 8.0);
    const double r = 8192.0 * f / (2 * std::numbers::pi);
    if (r > 4.0) {
      want.push_back(f);
    } else if (r < 1.0) {
      want.push_back(f / 8.0);
    } else {
      const double s = (r - 1.0) / 3.0;
      want.push_back(f * ((1 - s) / 8.0 + s));
    }
  }
  ExpectClose(RopeInverseFrequencies(c), want);
  // The same values from a transcription of transformers' _compute_llama3_parameters (Python,
  // float64): pairs 0-3 keep their frequency, 4 is blended, 5-7 are divided by 8.
  ExpectClose(
      RopeInverseFrequencies(c),
      {1.0, 0.19392274474868576, 0.03760603093086393, 0.0072926647372171085, 0.0005248461609929547,
       3.428102195952591e-05, 6.647869871181236e-06, 1.2891731721515574e-06});
}

TEST(RopeInverseFrequenciesTest, Yarn) {
  ModelConfig c = TinyRopeConfig(16, 10000.0f);
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::kYarn;
  rs.factor = 4.0f;
  rs.original_max_position_embeddings = 2048;
  // From a transcription of transformers' _compute_yarn_parameters (float64): the correction
  // range is [2, 6]; pairs 0-1 extrapolate, 6-7 interpolate (/4), 2-5 ramp.
  ExpectClose(RopeInverseFrequencies(c),
              {1.0, 0.31622776601683794, 0.1, 0.02569350598886808, 0.00625, 0.0013834964763236657,
               0.00025, 7.905694150420948e-05});
}

TEST(RopeInverseFrequenciesTest, ParsedLlama31MatchesDirect) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31_8B);
  ASSERT_TRUE(c.ok());
  const std::vector<float> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  // The lowest frequency is divided by the full factor.
  EXPECT_NEAR(inv[63], std::pow(500000.0, -126.0 / 128) / 8.0, 1e-12);
}

}  // namespace
}  // namespace treespec
