// Runs the treespec-random-model binary and loads what it wrote.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/random_model.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

namespace fs = std::filesystem;

class RandomModelToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) / "random_model_tool_test").string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  int Run(const std::string& flags) {
    const std::string cmd =
        std::string(TREESPEC_BIN_DIR) + "/treespec-random-model " + flags + " >/dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

  std::string dir_;
};

TEST_F(RandomModelToolTest, WritesALoadableModel) {
  ASSERT_EQ(Run("--arch=qwen2 --vocab=50 --hidden=32 --intermediate=40 --layers=1 --heads=4 "
                "--kv_heads=2 --context=1024 --tied --dtype=f16 --shards=2 --seed=3 --eos=2,3 "
                "--bos=1 --rope_scaling=llama3:4 --out=" +
                dir_),
            0);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->vocab_size, 50);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 3}));
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 256);
  EXPECT_TRUE(fs::exists(dir_ + "/model.safetensors.index.json"));

  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> want(w->embed.numel());
  RandomTensorValues(3, 0.02f, "model.embed_tokens.weight", SlotKind::kVocab, 0,
                     absl::MakeSpan(want));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(w->embed.data()[i], HalfBitsToFloat(FloatToHalfBits(want[i]))) << i;
  }
}

TEST_F(RandomModelToolTest, WritesADeepseekV3Model) {
  ASSERT_EQ(Run("--arch=deepseek_v3 --vocab=64 --hidden=32 --intermediate=48 --layers=3 "
                "--heads=4 --q_lora_rank=24 --kv_lora_rank=20 --qk_nope_head_dim=12 "
                "--qk_rope_head_dim=6 --v_head_dim=10 --experts=6 --shared_experts=2 "
                "--experts_per_tok=2 --expert_groups=3 --topk_groups=2 --moe_intermediate=16 "
                "--first_dense=1 --routed_scaling=2 --rope_scaling=yarn:4 --yarn_mscale=1 "
                "--yarn_mscale_all_dim=0.5 --out=" +
                dir_),
            0);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c->attention, AttentionKind::kMla);
  EXPECT_EQ(c->mla.q_lora_rank, 24);
  EXPECT_EQ(c->mla.latent_width(), 26);
  EXPECT_EQ(c->moe.num_experts, 6);
  EXPECT_EQ(c->moe.num_shared_experts, 2);
  EXPECT_EQ(c->moe.num_groups, 3);
  EXPECT_FLOAT_EQ(c->moe.routed_scaling_factor, 2.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.mscale_all_dim, 0.5f);
  const double m = YarnMscale(4.0, 0.5);
  EXPECT_FLOAT_EQ(c->mla.softmax_scale, static_cast<float>(m * m / std::sqrt(18.0)));
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_, *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[2].moe.experts.size(), 6u);
}

TEST_F(RandomModelToolTest, RejectsBadFlags) {
  EXPECT_NE(Run("--arch=deepseek_v3 --experts=6 --expert_groups=4 --out=" + dir_), 0);
  EXPECT_NE(Run("--arch=gpt2 --out=" + dir_), 0);
  EXPECT_NE(Run("--heads=4 --kv_heads=3 --out=" + dir_), 0);
  EXPECT_NE(Run("--rope_scaling=dynamic:2 --out=" + dir_), 0);
  EXPECT_NE(Run("--dtype=f64 --out=" + dir_), 0);
  EXPECT_NE(Run(""), 0);  // --out is required
  EXPECT_FALSE(fs::exists(dir_ + "/config.json"));
}

}  // namespace
}  // namespace treespec
