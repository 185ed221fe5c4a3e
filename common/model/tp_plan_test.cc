#include "common/model/tp_plan.h"

#include <cstring>
#include <vector>

#include "common/model/cpu_test_util.h"
#include "common/model/tp_shard.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

ModelConfig Config(int q_heads, int kv_heads, int intermediate, int vocab) {
  ModelConfig c = testing::SmallLlamaConfig();
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 8;
  c.hidden_size = 64;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  return c;
}

TEST(TpPlanTest, UnevenHeadsStraddleGqaGroups) {
  auto plan = MakeTpPlan(Config(14, 2, 704, 4096), 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->group_size, 7);
  ASSERT_EQ(plan->world_size(), 3);
  const auto& r = plan->ranks;
  EXPECT_EQ(r[0].q_head_begin, 0);
  EXPECT_EQ(r[0].q_head_end, 4);
  EXPECT_EQ(r[1].q_head_begin, 4);
  EXPECT_EQ(r[1].q_head_end, 9);
  EXPECT_EQ(r[2].q_head_begin, 9);
  EXPECT_EQ(r[2].q_head_end, 14);
  EXPECT_EQ(r[0].kv_head_begin, 0);
  EXPECT_EQ(r[0].kv_head_end, 1);
  EXPECT_EQ(r[1].kv_head_begin, 0);
  EXPECT_EQ(r[1].kv_head_end, 2);  // straddles: both heads
  EXPECT_EQ(r[2].kv_head_begin, 1);
  EXPECT_EQ(r[2].kv_head_end, 2);
}

TEST(TpPlanTest, MlpSplitInUnitsOf64RemainderToLastRanks) {
  auto plan = MakeTpPlan(Config(14, 2, 704, 4096), 7);
  ASSERT_TRUE(plan.ok());
  const std::vector<int> widths = {64, 64, 64, 128, 128, 128, 128};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(plan->ranks[i].mlp_width(), widths[i]) << i;
  // 4096 = 7 * 585 + 1.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(plan->ranks[i].vocab_size(), 585);
  EXPECT_EQ(plan->ranks[6].vocab_size(), 586);
  EXPECT_EQ(plan->max_vocab_slice(), 586);

  // Fewer 64-column units than ranks: the first ranks hold no MLP columns.
  auto narrow = MakeTpPlan(Config(8, 4, 320, 100), 7);
  ASSERT_TRUE(narrow.ok());
  const std::vector<int> narrow_widths = {0, 0, 64, 64, 64, 64, 64};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(narrow->ranks[i].mlp_width(), narrow_widths[i]) << i;

  // A width that is not a multiple of 64: the part-unit goes to the last rank.
  auto odd = MakeTpPlan(Config(8, 4, 100, 100), 2);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->ranks[0].mlp_width(), 0);
  EXPECT_EQ(odd->ranks[1].mlp_width(), 100);
}

TEST(TpPlanTest, InvariantsForManyShapes) {
  for (int q : {1, 2, 8, 14, 32}) {
    for (int kv : {1, 2, 4, 8}) {
      if (q % kv != 0) continue;
      for (int tp = 1; tp <= q; ++tp) {
        const ModelConfig c = Config(q, kv, 64 * 11 + 17, 1000 + q);
        auto plan = MakeTpPlan(c, tp);
        ASSERT_TRUE(plan.ok()) << q << "/" << kv << " tp " << tp;
        int q_next = 0, mlp_next = 0, vocab_next = 0, q_min = q, q_max = 0;
        for (const TpRankPlan& r : plan->ranks) {
          EXPECT_EQ(r.q_head_begin, q_next);
          EXPECT_EQ(r.mlp_begin, mlp_next);
          EXPECT_EQ(r.vocab_begin, vocab_next);
          EXPECT_GE(r.num_q_heads(), 1);
          q_min = std::min(q_min, r.num_q_heads());
          q_max = std::max(q_max, r.num_q_heads());
          // Exactly the KV heads its q heads read.
          EXPECT_EQ(r.kv_head_begin, r.q_head_begin / (q / kv));
          EXPECT_EQ(r.kv_head_end - 1, (r.q_head_end - 1) / (q / kv));
          if (&r != &plan->ranks.back()) EXPECT_EQ(r.mlp_width() % kMlpSplitUnit, 0);
          q_next = r.q_head_end;
          mlp_next = r.mlp_end;
          vocab_next = r.vocab_end;
        }
        EXPECT_EQ(q_next, q);
        EXPECT_EQ(mlp_next, c.intermediate_size);
        EXPECT_EQ(vocab_next, c.vocab_size);
        EXPECT_LE(q_max - q_min, 1);
      }
    }
  }
}

TEST(TpPlanTest, RejectsBadRankCounts) {
  const ModelConfig c = Config(8, 4, 320, 100);
  EXPECT_EQ(MakeTpPlan(c, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTpPlan(c, 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTpPlan(Config(8, 3, 320, 100), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

bool SameRows(const Tensor& part, const Tensor& full, int64_t begin) {
  const int64_t width = full.rank() == 2 ? full.dim(1) : 1;
  return std::memcmp(part.data(), full.data() + begin * width, part.numel() * sizeof(float)) == 0;
}

bool SameColumns(const Tensor& part, const Tensor& full, int64_t begin) {
  for (int64_t r = 0; r < full.dim(0); ++r) {
    for (int64_t c = 0; c < part.dim(1); ++c) {
      if (part.row(r)[c] != full.row(r)[begin + c]) return false;
    }
  }
  return part.dim(0) == full.dim(0);
}

TEST(ShardWeightsTest, SlicesReassembleTheFullModel) {
  for (bool qwen2 : {false, true}) {
    ModelConfig c = Config(14, 2, 704, 300);
    c.qkv_bias = qwen2;
    c.qk_norm = !qwen2;
    c.tie_word_embeddings = qwen2;
    const ModelWeights full = testing::RandomWeights(c, 7);
    auto plan = MakeTpPlan(c, 3);
    ASSERT_TRUE(plan.ok());
    const int64_t d = c.head_dim;
    for (int rank = 0; rank < 3; ++rank) {
      auto shard = ShardWeights(c, full, *plan, rank);
      ASSERT_TRUE(shard.ok()) << shard.status();
      const TpRankPlan& p = plan->ranks[rank];
      EXPECT_EQ(shard->embed.dim(0), p.vocab_size());
      EXPECT_TRUE(SameRows(shard->embed, full.embed, p.vocab_begin));
      EXPECT_EQ(shard->lm_head.empty(), c.tie_word_embeddings);
      if (!c.tie_word_embeddings)
        EXPECT_TRUE(SameRows(shard->lm_head, full.lm_head, p.vocab_begin));
      EXPECT_TRUE(SameRows(shard->final_norm, full.final_norm, 0));
      for (int l = 0; l < c.num_layers; ++l) {
        const GqaWeights& s = shard->layers[l].gqa;
        const GqaWeights& f = full.layers[l].gqa;
        const DenseMlpWeights& sm = shard->layers[l].mlp;
        const DenseMlpWeights& fm = full.layers[l].mlp;
        EXPECT_EQ(s.wq.dim(0), p.num_q_heads() * d);
        EXPECT_TRUE(SameRows(s.wq, f.wq, p.q_head_begin * d));
        EXPECT_EQ(s.wk.dim(0), p.num_kv_heads() * d);
        EXPECT_TRUE(SameRows(s.wk, f.wk, p.kv_head_begin * d));
        EXPECT_TRUE(SameRows(s.wv, f.wv, p.kv_head_begin * d));
        if (qwen2) {
          EXPECT_TRUE(SameRows(s.bq, f.bq, p.q_head_begin * d));
          EXPECT_TRUE(SameRows(s.bk, f.bk, p.kv_head_begin * d));
          EXPECT_TRUE(SameRows(s.bv, f.bv, p.kv_head_begin * d));
        } else {
          EXPECT_TRUE(SameRows(s.q_norm, f.q_norm, 0));
          EXPECT_TRUE(SameRows(s.k_norm, f.k_norm, 0));
        }
        EXPECT_TRUE(SameColumns(s.wo, f.wo, p.q_head_begin * d));
        EXPECT_EQ(sm.w_gate.dim(0), p.mlp_width());
        EXPECT_TRUE(SameRows(sm.w_gate, fm.w_gate, p.mlp_begin));
        EXPECT_TRUE(SameRows(sm.w_up, fm.w_up, p.mlp_begin));
        EXPECT_TRUE(SameColumns(sm.w_down, fm.w_down, p.mlp_begin));
        EXPECT_TRUE(SameRows(shard->layers[l].input_norm, full.layers[l].input_norm, 0));
        EXPECT_TRUE(SameRows(shard->layers[l].post_norm, full.layers[l].post_norm, 0));
      }
    }
  }
}

TEST(ShardWeightsTest, RejectsWrongShapes) {
  const ModelConfig c = Config(8, 4, 320, 100);
  ModelWeights w = testing::RandomWeights(c, 1);
  w.layers[1].gqa.wk = Tensor({3, 3});
  auto plan = MakeTpPlan(c, 2);
  ASSERT_TRUE(plan.ok());
  auto shard = ShardWeights(c, w, *plan, 0);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shard.status().message().find("model.layers.1.self_attn.k_proj.weight"),
            std::string::npos)
      << shard.status();
}

}  // namespace
}  // namespace treespec
