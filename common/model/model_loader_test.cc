// LoadModelWeights and WriteRandomModel together: random checkpoints written in every layout
// must load back to exactly the values written (after the storage dtype's rounding), and
// every way a checkpoint can disagree with its config must be an error naming tensor and file.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/random_model.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

ModelConfig TinyConfig(const std::string& arch, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  // Qwen3 gets a head_dim other than hidden / heads, as real Qwen3 models have.
  c.head_dim = arch == "Qwen3ForCausalLM" ? 16 : 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == "Qwen2ForCausalLM";
  c.qk_norm = arch == "Qwen3ForCausalLM";
  c.bos_token_id = 1;
  c.eos_token_ids = {2, 3};
  return c;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void EditConfig(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(ReadFile(dir + "/config.json"));
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : name) {
      if (ch == '/') ch = '_';
    }
    dir_ = (fs::path(::testing::TempDir()) / ("model_loader_test_" + name)).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::Status Write(const ModelConfig& c, DType dtype = DType::kF32, int shards = 1,
                     uint64_t seed = 5) {
    RandomModelOptions o;
    o.dtype = dtype;
    o.num_shards = shards;
    o.seed = seed;
    o.init_std = 0.5f;  // large enough that bf16/f16 rounding is visible
    return WriteRandomModel(c, o, dir_);
  }

  std::string dir_;
};

// Checks every slot of `w` against the values WriteRandomModel stores.
void ExpectRandomValues(const ModelConfig& c, ModelWeights& w, DType dtype, uint64_t seed,
                        float std) {
  int checked = 0;
  ForEachTensor(c, w, [&](TensorSlot& slot) {
    if (!slot.present) {
      EXPECT_TRUE(slot.tensor->empty()) << slot.hf_name;
      return;
    }
    ASSERT_EQ(slot.tensor->shape(), slot.shape) << slot.hf_name;
    std::vector<float> want(slot.tensor->numel());
    RandomTensorValues(seed, std, slot.hf_name, slot.kind, 0, absl::MakeSpan(want));
    std::vector<uint8_t> stored(want.size() * DTypeSize(dtype));
    ConvertFromFloat(dtype, want, stored.data());
    ConvertToFloat(dtype, stored.data(), absl::MakeSpan(want));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(slot.tensor->data()[i], want[i]) << slot.hf_name << "[" << i << "]";
    }
    ++checked;
  });
  EXPECT_GT(checked, 10);
}

using RoundTripParam = std::tuple<std::string, DType, bool, int>;  // arch, dtype, tied, shards

class RoundTripTest : public ModelDirTest, public ::testing::WithParamInterface<RoundTripParam> {};

TEST_P(RoundTripTest, LoadsWhatWasWritten) {
  const auto& [arch, dtype, tied, shards] = GetParam();
  const ModelConfig c = TinyConfig(arch, tied);
  ASSERT_TRUE(Write(c, dtype, shards).ok());

  absl::StatusOr<ModelConfig> loaded = LoadModelConfig(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->architecture, c.architecture);
  EXPECT_EQ(loaded->vocab_size, c.vocab_size);
  EXPECT_EQ(loaded->hidden_size, c.hidden_size);
  EXPECT_EQ(loaded->intermediate_size, c.intermediate_size);
  EXPECT_EQ(loaded->num_layers, c.num_layers);
  EXPECT_EQ(loaded->num_q_heads, c.num_q_heads);
  EXPECT_EQ(loaded->num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(loaded->head_dim, c.head_dim);
  EXPECT_EQ(loaded->max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(loaded->rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(loaded->rope_theta, c.rope_theta);
  EXPECT_EQ(loaded->tie_word_embeddings, tied);
  EXPECT_EQ(loaded->qkv_bias, c.qkv_bias);
  EXPECT_EQ(loaded->qk_norm, c.qk_norm);
  EXPECT_EQ(loaded->bos_token_id, 1);
  EXPECT_EQ(loaded->eos_token_ids, c.eos_token_ids);

  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *loaded);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->lm_head.empty(), tied);
  EXPECT_EQ(w->layers[0].gqa.bq.empty(), !c.qkv_bias);
  EXPECT_EQ(w->layers[1].gqa.k_norm.empty(), !c.qk_norm);
  ExpectRandomValues(c, *w, dtype, 5, 0.5f);

  EXPECT_EQ(fs::exists(dir_ + "/model.safetensors.index.json"), shards > 1);
  EXPECT_EQ(fs::exists(dir_ + "/model.safetensors"), shards == 1);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, RoundTripTest,
    ::testing::Combine(::testing::Values("LlamaForCausalLM", "MistralForCausalLM",
                                         "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Bool(),
                       ::testing::Values(1, 3)),
    [](const ::testing::TestParamInfo<RoundTripParam>& info) {
      return absl::StrCat(
          std::get<0>(info.param).substr(0, 5), "_", DTypeSafetensorsName(std::get<1>(info.param)),
          std::get<2>(info.param) ? "_tied" : "", "_shards", std::get<3>(info.param));
    });

TEST_F(ModelDirTest, ShardedLayout) {
  const ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  ASSERT_TRUE(Write(c, DType::kBF16, 4).ok());
  nlohmann::json index = nlohmann::json::parse(ReadFile(dir_ + "/model.safetensors.index.json"));
  std::set<std::string> files;
  uint64_t tensor_bytes = 0;
  for (const auto& [name, file] : index["weight_map"].items())
    files.insert(file.get<std::string>());
  EXPECT_EQ(files, (std::set<std::string>{
                       "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                       "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
  // 1 embedding + 2 * 9 per layer + final norm + lm_head.
  EXPECT_EQ(index["weight_map"].size(), 1u + 2 * 9 + 1 + 1);
  for (const std::string& f : files) {
    auto sf = SafetensorsFile::Open(dir_ + "/" + f);
    ASSERT_TRUE(sf.ok()) << sf.status();
    EXPECT_FALSE((*sf)->tensors().empty());
    for (const auto& t : (*sf)->tensors()) {
      EXPECT_EQ(index["weight_map"][t.name], f);
      tensor_bytes += t.end - t.begin;
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"], tensor_bytes);
}

TEST_F(ModelDirTest, DeterministicAndSeedDependent) {
  const ModelConfig c = TinyConfig("Qwen2ForCausalLM", false);
  ASSERT_TRUE(Write(c, DType::kBF16, 1, 9).ok());
  const std::string first = ReadFile(dir_ + "/model.safetensors");
  ASSERT_TRUE(Write(c, DType::kBF16, 1, 9).ok());
  EXPECT_EQ(ReadFile(dir_ + "/model.safetensors"), first);
  ASSERT_TRUE(Write(c, DType::kBF16, 1, 10).ok());
  EXPECT_NE(ReadFile(dir_ + "/model.safetensors"), first);
  // Switching layouts removes the stale one.
  ASSERT_TRUE(Write(c, DType::kBF16, 2, 9).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/model.safetensors"));
  ASSERT_TRUE(Write(c, DType::kBF16, 1, 9).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ + "/model-00001-of-00002.safetensors"));
  EXPECT_EQ(ReadFile(dir_ + "/model.safetensors"), first);
}

TEST_F(ModelDirTest, RandomValuesLookLikeTheInit) {
  // Mean ~0 and std ~init_std for matrices; norms centred on 1.
  std::vector<float> v(1 << 16);
  RandomTensorValues(1, 0.02f, "model.layers.0.mlp.up_proj.weight", SlotKind::kMlpOut, 0,
                     absl::MakeSpan(v));
  double sum = 0, sum2 = 0;
  for (float x : v) {
    sum += x;
    sum2 += x * x;
  }
  const double mean = sum / v.size();
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sum2 / v.size() - mean * mean), 0.02, 0.0005);
  RandomTensorValues(1, 0.02f, "model.norm.weight", SlotKind::kNorm, 0, absl::MakeSpan(v));
  sum = 0;
  for (float x : v) sum += x;
  EXPECT_NEAR(sum / v.size(), 1.0, 0.001);
  // Values depend on the element index only, not on where a chunk starts.
  std::vector<float> tail(100);
  RandomTensorValues(1, 0.02f, "model.norm.weight", SlotKind::kNorm, 1001, absl::MakeSpan(tail));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(tail[i], v[1001 + i]);
}

TEST_F(ModelDirTest, RopeScalingSurvivesConfigJson) {
  for (RopeScaling::Type type :
       {RopeScaling::Type::kLinear, RopeScaling::Type::kLlama3, RopeScaling::Type::kYarn}) {
    ModelConfig c = TinyConfig("LlamaForCausalLM", true);
    c.rope_scaling.type = type;
    c.rope_scaling.factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 64;
    if (type == RopeScaling::Type::kYarn) c.rope_scaling.attention_factor = 1.25f;
    absl::StatusOr<ModelConfig> parsed = ParseModelConfig(ModelConfigToHfJson(c, DType::kBF16));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->rope_scaling.type, type);
    EXPECT_EQ(parsed->rope_scaling.factor, 4.0f);
    if (type != RopeScaling::Type::kLinear) {
      EXPECT_EQ(parsed->rope_scaling.original_max_position_embeddings, 64);
    }
    EXPECT_EQ(parsed->rope_scaling.attention_factor,
              type == RopeScaling::Type::kYarn ? 1.25f : 1.0f);
    EXPECT_EQ(RopeInverseFrequencies(*parsed), RopeInverseFrequencies(c));
  }
}

TEST_F(ModelDirTest, ShapeMismatchNamesTensorFileAndShapes) {
  ASSERT_TRUE(Write(TinyConfig("LlamaForCausalLM", false)).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["intermediate_size"] = 64; });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_THAT(msg, HasSubstr(dir_ + "/model.safetensors"));
  EXPECT_THAT(msg, HasSubstr("'model.layers.0.mlp.gate_proj.weight'"));
  EXPECT_THAT(msg, HasSubstr("[48, 32]"));
  EXPECT_THAT(msg, HasSubstr("[64, 32]"));
}

TEST_F(ModelDirTest, HiddenSizeMismatchNamesFirstTensor) {
  ASSERT_TRUE(Write(TinyConfig("MistralForCausalLM", false), DType::kBF16, 2).ok());
  EditConfig(dir_, [](nlohmann::json& j) {
    j["hidden_size"] = 64;
    j["head_dim"] = 16;
  });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_THAT(msg, HasSubstr(dir_ + "/model-00001-of-00002.safetensors"));
  EXPECT_THAT(msg, HasSubstr("'model.embed_tokens.weight'"));
  EXPECT_THAT(msg, HasSubstr("[97, 32]"));
  EXPECT_THAT(msg, HasSubstr("[97, 64]"));
}

TEST_F(ModelDirTest, MissingTensorNamesTensorAndFilesSearched) {
  ASSERT_TRUE(Write(TinyConfig("LlamaForCausalLM", true), DType::kF32, 2).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(w.status().message());
  EXPECT_THAT(msg, HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(msg, HasSubstr(dir_ + "/model-00001-of-00002.safetensors"));
  EXPECT_THAT(msg, HasSubstr(dir_ + "/model-00002-of-00002.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tie_word_embeddings"));
}

TEST_F(ModelDirTest, MissingBiasForQwen2) {
  ASSERT_TRUE(Write(TinyConfig("LlamaForCausalLM", false)).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["architectures"] = {"Qwen2ForCausalLM"}; });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("'model.layers.0.self_attn.q_proj.bias'"));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir_ + "/model.safetensors"));
}

TEST_F(ModelDirTest, UnusedDecoderTensorsAreErrors) {
  // Qwen2 weights (with q/k/v biases) under a Llama config: the biases would be dropped.
  ASSERT_TRUE(Write(TinyConfig("Qwen2ForCausalLM", false)).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["architectures"] = {"LlamaForCausalLM"}; });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("'model.layers.0.self_attn.k_proj.bias'"));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir_ + "/model.safetensors"));

  // More layers in the checkpoint than in the config.
  ASSERT_TRUE(Write(TinyConfig("LlamaForCausalLM", false)).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["num_hidden_layers"] = 1; });
  c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok());
  w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("'model.layers.1."));
}

// A tiny DeepSeek-V3: MLA (q LoRA optional), one dense layer, then MoE layers.
ModelConfig TinyDeepseekConfig(int q_lora_rank, int shared_experts) {
  ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  c.architecture = "DeepseekV3ForCausalLM";
  c.num_layers = 3;
  c.num_kv_heads = c.num_q_heads;
  c.attention = AttentionKind::kMla;
  c.mla.q_lora_rank = q_lora_rank;
  c.mla.kv_lora_rank = 24;
  c.mla.qk_nope_head_dim = 12;
  c.mla.qk_rope_head_dim = 6;
  c.mla.v_head_dim = 10;
  c.mla.rope_interleave = true;
  c.mla.softmax_scale = static_cast<float>(1.0 / std::sqrt(18.0));
  c.head_dim = 6;
  c.moe.num_experts = 6;
  c.moe.num_shared_experts = shared_experts;
  c.moe.experts_per_token = 2;
  c.moe.num_groups = 3;
  c.moe.topk_groups = 2;
  c.moe.expert_intermediate_size = 16;
  c.moe.first_dense_layers = 1;
  c.moe.routed_scaling_factor = 2.5f;
  c.moe.norm_topk_prob = false;
  return c;
}

TEST_F(ModelDirTest, DeepseekRoundTrip) {
  for (const auto& [q_lora, shared] : {std::pair{0, 1}, std::pair{20, 0}, std::pair{20, 2}}) {
    const ModelConfig c = TinyDeepseekConfig(q_lora, shared);
    ASSERT_TRUE(Write(c, DType::kBF16, 2).ok());
    absl::StatusOr<ModelConfig> loaded = LoadModelConfig(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->attention, AttentionKind::kMla);
    EXPECT_EQ(loaded->head_dim, 6);
    EXPECT_EQ(loaded->mla.q_lora_rank, q_lora);
    EXPECT_EQ(loaded->mla.kv_lora_rank, 24);
    EXPECT_EQ(loaded->mla.qk_nope_head_dim, 12);
    EXPECT_EQ(loaded->mla.v_head_dim, 10);
    EXPECT_FLOAT_EQ(loaded->mla.softmax_scale, c.mla.softmax_scale);
    EXPECT_EQ(loaded->moe.num_experts, 6);
    EXPECT_EQ(loaded->moe.num_shared_experts, shared);
    EXPECT_EQ(loaded->moe.num_groups, 3);
    EXPECT_EQ(loaded->moe.topk_groups, 2);
    EXPECT_EQ(loaded->moe.first_dense_layers, 1);
    EXPECT_FALSE(loaded->moe.norm_topk_prob);
    absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *loaded);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->layers[1].moe.experts.size(), 6u);
    EXPECT_EQ(w->layers[2].moe.shared.w_gate.shape(), (std::vector<int64_t>{16 * shared, 32}));
    EXPECT_TRUE(w->layers[0].moe.router.empty());  // the dense first layer
    ExpectRandomValues(c, *w, DType::kBF16, 5, 0.5f);
  }
}

TEST_F(ModelDirTest, DeepseekMtpLayersAreSkippedOthersAreErrors) {
  ASSERT_TRUE(Write(TinyDeepseekConfig(20, 1)).ok());
  // The third layer's tensors become the one multi-token-prediction layer.
  EditConfig(dir_, [](nlohmann::json& j) {
    j["num_hidden_layers"] = 2;
    j["num_nextn_predict_layers"] = 1;
  });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers.size(), 2u);

  EditConfig(dir_, [](nlohmann::json& j) { j["num_nextn_predict_layers"] = 0; });
  c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok());
  w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("'model.layers.2."));
}

TEST_F(ModelDirTest, DeepseekMissingExpertNamesTensorAndConfig) {
  const ModelConfig c = TinyDeepseekConfig(20, 1);
  ASSERT_TRUE(Write(c).ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string dropped = "model.layers.2.mlp.experts.4.up_proj.weight";
  std::vector<std::pair<std::string, const Tensor*>> kept;
  ForEachTensor(c, *w, [&](TensorSlot& s) {
    if (s.present && s.hf_name != dropped) kept.push_back({s.hf_name, s.tensor});
  });
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", kept, DType::kF32).ok());
  absl::StatusOr<ModelWeights> again = LoadModelWeights(dir_, c);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("'" + dropped + "'"));
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("n_routed_experts=6"));

  // An expert count that disagrees with the checkpoint: the router's shape says so.
  EditConfig(dir_, [](nlohmann::json& j) { j["n_routed_experts"] = 9; });
  absl::StatusOr<ModelConfig> nine = LoadModelConfig(dir_);
  ASSERT_TRUE(nine.ok()) << nine.status();
  again = LoadModelWeights(dir_, *nine);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("mlp.gate.weight"));
}

// Transformers 5's in-memory layout: one gate_up_proj [E, 2 I, H] and one down_proj [E, H, I]
// per MoE layer instead of a tensor per expert.
TEST_F(ModelDirTest, DeepseekFusedExpertsLoadAsPerExpert) {
  const ModelConfig c = TinyDeepseekConfig(20, 1);
  ASSERT_TRUE(Write(c).ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_TRUE(w.ok()) << w.status();
  auto fuse = [&](int extra_experts) {
    std::vector<std::pair<std::string, const Tensor*>> kept;
    ForEachTensor(c, *w, [&](TensorSlot& s) {
      if (s.present && s.hf_name.find(".mlp.experts.") == std::string::npos) {
        kept.push_back({s.hf_name, s.tensor});
      }
    });
    std::vector<Tensor> fused;
    fused.reserve(4);
    for (int l = 1; l < c.num_layers; ++l) {
      const std::vector<DenseMlpWeights>& experts = w->layers[l].moe.experts;
      const int64_t e = experts.size() + extra_experts, inter = 16, hidden = 32;
      std::vector<float> gate_up, down;
      for (int64_t x = 0; x < e; ++x) {
        const DenseMlpWeights& m = experts[x % experts.size()];
        for (const Tensor* t : {&m.w_gate, &m.w_up}) {
          gate_up.insert(gate_up.end(), t->data(), t->data() + t->numel());
        }
        down.insert(down.end(), m.w_down.data(), m.w_down.data() + m.w_down.numel());
      }
      fused.emplace_back(std::vector<int64_t>{e, 2 * inter, hidden}, std::move(gate_up));
      fused.emplace_back(std::vector<int64_t>{e, hidden, inter}, std::move(down));
    }
    for (int l = 1; l < c.num_layers; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.experts.");
      kept.push_back({p + "gate_up_proj", &fused[2 * (l - 1)]});
      kept.push_back({p + "down_proj", &fused[2 * (l - 1) + 1]});
    }
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", kept, DType::kF32).ok());
  };
  fuse(0);
  absl::StatusOr<ModelWeights> fused = LoadModelWeights(dir_, c);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectRandomValues(c, *fused, DType::kF32, 5, 0.5f);

  fuse(1);  // one expert more than config.json says
  fused = LoadModelWeights(dir_, c);
  ASSERT_FALSE(fused.ok());
  EXPECT_THAT(std::string(fused.status().message()), HasSubstr("holds 7 experts"));
}

// Rewrites the checkpoint of a tied model as one file that also holds `extra` tensors.
void RewriteWithExtras(const std::string& dir, const ModelConfig& c,
                       const std::vector<std::pair<std::string, const Tensor*>>& extra) {
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir, c);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<std::pair<std::string, const Tensor*>> all;
  ForEachTensor(c, *w, [&](TensorSlot& s) {
    if (s.present) all.push_back({s.hf_name, s.tensor});
  });
  all.insert(all.end(), extra.begin(), extra.end());
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", all, DType::kF32).ok());
}

TEST_F(ModelDirTest, TiedCheckpointMayCarryAnEqualLmHead) {
  const ModelConfig c = TinyConfig("Qwen3ForCausalLM", true);
  ASSERT_TRUE(Write(c).ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_TRUE(w.ok());
  Tensor inv_freq({4}, {1, 2, 3, 4});
  RewriteWithExtras(
      dir_, c,
      {{"lm_head.weight", &w->embed}, {"model.layers.0.self_attn.rotary_emb.inv_freq", &inv_freq}});
  absl::StatusOr<ModelWeights> again = LoadModelWeights(dir_, c);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->lm_head.empty());
  ExpectRandomValues(c, *again, DType::kF32, 5, 0.5f);
}

TEST_F(ModelDirTest, TiedConfigWithDifferentLmHeadIsAnError) {
  ASSERT_TRUE(Write(TinyConfig("LlamaForCausalLM", false)).ok());
  EditConfig(dir_, [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_THAT(msg, HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(msg, HasSubstr("tie_word_embeddings"));
  EXPECT_THAT(msg, HasSubstr(dir_ + "/model.safetensors"));
}

TEST_F(ModelDirTest, MissingDirectoryNamesPath) {
  const std::string missing = dir_ + "/does-not-exist";
  absl::StatusOr<ModelWeights> w = LoadModelWeights(missing, TinyConfig("LlamaForCausalLM", false));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(missing));
  absl::StatusOr<ModelConfig> c = LoadModelConfig(missing);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(missing + "/config.json"));
}

TEST_F(ModelDirTest, NoCheckpointFilesNamesDirectory) {
  const ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  ASSERT_TRUE(Write(c).ok());
  fs::remove(dir_ + "/model.safetensors");
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir_));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("model.safetensors"));
}

TEST_F(ModelDirTest, MissingShardNamesIt) {
  const ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  ASSERT_TRUE(Write(c, DType::kF32, 3).ok());
  fs::remove(dir_ + "/model-00002-of-00003.safetensors");
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr(dir_ + "/model-00002-of-00003.safetensors"));
}

TEST_F(ModelDirTest, IndexPointingAtTheWrongShard) {
  const ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  ASSERT_TRUE(Write(c, DType::kF32, 2).ok());
  const std::string index_path = dir_ + "/model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(ReadFile(index_path));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // it is in 00002
  std::ofstream(index_path) << index.dump();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(index_path));

  std::ofstream(index_path) << "{not json";
  w = LoadModelWeights(dir_, c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(index_path));
}

TEST_F(ModelDirTest, TruncatedShardNamesFileAndTensor) {
  const ModelConfig c = TinyConfig("LlamaForCausalLM", false);
  ASSERT_TRUE(Write(c, DType::kBF16, 2).ok());
  const std::string shard = dir_ + "/model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 2);
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, c);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(shard));
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("'lm_head.weight'"));  // the last tensor
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("truncated"));
}

TEST_F(ModelDirTest, UnsupportedDTypeNamesTensorAndFile) {
  ModelConfig c = TinyConfig("LlamaForCausalLM", true);
  c.num_layers = 1;
  fs::create_directories(dir_);
  // A checkpoint whose final norm is stored as F64.
  ModelWeights w;
  std::vector<SafetensorsEntry> entries;
  ForEachTensor(c, w, [&](TensorSlot& s) {
    if (s.present) entries.push_back({s.hf_name, DType::kF32, s.shape});
  });
  {
    auto writer = SafetensorsWriter::Create(dir_ + "/model.safetensors", entries);
    ASSERT_TRUE(writer.ok());
    for (const auto& e : entries) {
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      ASSERT_TRUE((*writer)->Append(std::vector<float>(n, 1.0f)).ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  // Patch the header in place: "F32" -> "I32" for model.norm.weight keeps sizes valid.
  std::string bytes = ReadFile(dir_ + "/model.safetensors");
  const std::string from = R"("model.norm.weight":{"data_offsets")";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  const size_t dtype_at = bytes.find("\"F32\"", at);
  bytes.replace(dtype_at, 5, "\"I32\"");
  std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << bytes;
  absl::StatusOr<ModelWeights> loaded = LoadModelWeights(dir_, c);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("I32"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(dir_ + "/model.safetensors"));
}

TEST_F(ModelDirTest, RefusesConfigsThatWouldNotLoad) {
  ModelConfig c = TinyConfig("MistralForCausalLM", false);
  c.num_kv_heads = 3;  // does not divide 4 query heads
  absl::Status s = Write(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_key_value_heads"));
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(ModelDirTest, TokenizerIsCopied) {
  fs::create_directories(dir_ + "_src");
  std::ofstream(dir_ + "_src/tokenizer.json") << R"({"model": {"type": "BPE"}})";
  RandomModelOptions o;
  o.tokenizer_path = dir_ + "_src/tokenizer.json";
  ASSERT_TRUE(WriteRandomModel(TinyConfig("LlamaForCausalLM", true), o, dir_).ok());
  EXPECT_EQ(ReadFile(dir_ + "/tokenizer.json"), R"({"model": {"type": "BPE"}})");
  o.tokenizer_path = dir_ + "_src/missing.json";
  absl::Status s = WriteRandomModel(TinyConfig("LlamaForCausalLM", true), o, dir_);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing.json"));
  fs::remove_all(dir_ + "_src");
}

// Checkpoints produced by transformers itself (another part of the project generates them).
class ReferenceModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceModelTest, Loads) {
  const std::string dir = std::string(TREESPEC_SOURCE_DIR) + "/" + GetParam();
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not present";
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(static_cast<int>(w->layers.size()), c->num_layers);
  EXPECT_EQ(w->lm_head.empty(), c->tie_word_embeddings);
  ForEachTensor(*c, *w, [&](TensorSlot& s) {
    if (!s.present) return;
    bool finite = true;
    for (float x : s.tensor->span()) finite = finite && std::isfinite(x);
    EXPECT_TRUE(finite) << s.hf_name;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, ReferenceModelTest,
    ::testing::Values("tests/data/models/llama_untied_f32",
                      "tests/data/models/llama3_rope_scaling_bf16", "tests/data/models/mistral_f16",
                      "tests/data/models/qwen2_bias", "tests/data/models/qwen3_qknorm",
                      "tests/data/models/llama_sharded", "models/tiny-target", "models/tiny-draft"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      std::string n = info.param.substr(info.param.rfind('/') + 1);
      for (char& ch : n) {
        if (ch == '-') ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace treespec
