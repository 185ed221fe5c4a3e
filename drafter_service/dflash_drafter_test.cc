// The DFlash drafter's sessions: they draft only with a feature row per context token but the
// bonus; a chain is each depth's argmax of one block forward; a tree is DDTree's best tree over
// the same per-depth marginals.
#include "drafter_service/dflash_drafter.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/backend/load_model.h"
#include "common/model/dtype.h"
#include "common/model/top_k.h"
#include "drafter_service/ddtree.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;

std::string Source(const std::string& rel) { return std::string(TREESPEC_SOURCE_DIR) + "/" + rel; }

class DflashDrafterTest : public ::testing::Test {
 protected:
  static DflashLm Load() {
    absl::StatusOr<DflashLm> d =
        LoadDflashLm(Source("tests/data/models/dflash_random"), Source("models/tiny-target"), "cpu",
                     LmOptions{.max_batch = 2});
    EXPECT_TRUE(d.ok()) << d.status();
    return *std::move(d);
  }
  void SetUp() override { ref_ = Load(); }

  DflashDrafterFactory NewFactory(DraftShape shape) {
    DflashLm d = Load();
    return DflashDrafterFactory(std::move(d.config), std::move(d.lm), DflashOptions{shape});
  }

  TargetFeatures Rows(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    TargetFeatures f;
    f.rows = n;
    f.width = ref_.config.features().width();
    for (int i = 0; i < n * f.width; ++i) f.bf16.push_back(FloatToBf16Bits(normal(rng)));
    return f;
  }

  // Logits [depth, vocab] of the block after `bonus` over `rows`, straight from a reference
  // drafter model: the rows appended at once, the block one bidirectional forward.
  std::vector<float> BlockLogits(const TargetFeatures& rows, int32_t bonus, int depth) const {
    CausalLm& lm = *ref_.lm;
    const SeqId seq = lm.CreateSequence();
    EXPECT_TRUE(lm.AppendContext(seq, 0, rows).ok());
    absl::StatusOr<std::vector<float>> logits =
        lm.Forward({DflashBlock(ref_.config, seq, rows.rows, bonus, depth + 1)});
    EXPECT_TRUE(logits.ok()) << logits.status();
    lm.FreeSequence(seq);
    const size_t vocab = ref_.config.body.vocab_size;
    return std::vector<float>(logits->begin() + vocab, logits->end());
  }

  // Each depth's argmax of the block after `bonus` over `rows`.
  std::vector<int32_t> Argmaxes(const TargetFeatures& rows, int32_t bonus, int depth) const {
    const std::vector<float> logits = BlockLogits(rows, bonus, depth);
    const int vocab = ref_.config.body.vocab_size;
    std::vector<int32_t> out;
    for (int d = 0; d < depth; ++d) {
      const float* row = logits.data() + static_cast<size_t>(d) * vocab;
      out.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    return out;
  }

  // Each depth's top k (token, log-prob) of the block after `bonus` over `rows`.
  std::vector<std::vector<Candidate>> Marginals(const TargetFeatures& rows, int32_t bonus,
                                                int depth, int k) const {
    const std::vector<float> logits = BlockLogits(rows, bonus, depth);
    const int vocab = ref_.config.body.vocab_size;
    std::vector<std::vector<Candidate>> out;
    std::vector<float> logprobs(vocab);
    for (int d = 0; d < depth; ++d) {
      LogSoftmax(absl::MakeConstSpan(logits.data() + static_cast<size_t>(d) * vocab, vocab),
                 absl::MakeSpan(logprobs));
      out.push_back(PerDepthCandidates::TopK(logprobs, k));
    }
    return out;
  }

  DflashLm ref_;
};

TEST_F(DflashDrafterTest, AChainIsEachDepthsArgmaxAndATreeHoldsIt) {
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15};
  const TargetFeatures prompt_rows = Rows(5, 1);
  const TargetFeatures more_rows = Rows(3, 2);
  TargetFeatures all = prompt_rows;
  all.Append(more_rows);
  const std::vector<int32_t> chain_want = Argmaxes(all, 42, 7);

  for (DraftShape shape : {DraftShape::kChain, DraftShape::kTree}) {
    DflashDrafterFactory factory = NewFactory(shape);
    EXPECT_EQ(factory.features(), (FeatureSpec{{1, 4}, 256, 6, 4096}));
    auto session = factory.NewSession();
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE((*session)->Append(TokenContext(prompt)).ok());
    // The prompt's rows come with commit 0: until then there is nothing to draft from.
    absl::StatusOr<DraftedTree> early = (*session)->Draft(SpecLimits{16, 7, 0});
    EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(early.status().message()), HasSubstr("0 rows for 5 tokens"));
    ASSERT_TRUE((*session)->Append(DraftContext{{30}, prompt_rows}).ok());
    ASSERT_TRUE((*session)->Append(DraftContext{{31, 32, 42}, more_rows}).ok());
    absl::StatusOr<DraftedTree> tree = (*session)->Draft(SpecLimits{24, 7, 0});
    ASSERT_TRUE(tree.ok()) << tree.status();
    if (shape == DraftShape::kChain) {
      EXPECT_EQ(tree->tokens, chain_want);
      EXPECT_EQ(tree->parents, (std::vector<int32_t>{-1, 0, 1, 2, 3, 4, 5}));
      continue;
    }
    // DDTree's best 24-node tree over the block's per-depth marginals (top 24 of each), its
    // first node the best first token.
    EXPECT_EQ(tree->tokens.size(), 24u);
    EXPECT_TRUE(ValidateDraftedTree(*tree, 4096, 24, 7).ok());
    EXPECT_EQ(tree->tokens[0], chain_want[0]);
    const DraftedTree want =
        BuildDdTree(PerDepthCandidates(Marginals(all, 42, 7, 24)), 0, SpecLimits{24, 7, 0});
    EXPECT_EQ(tree->tokens, want.tokens);
    EXPECT_EQ(tree->parents, want.parents);
    EXPECT_EQ(tree->logprobs, want.logprobs);
  }
}

// Rows [from, to) of `all`.
TargetFeatures RowsOf(const TargetFeatures& all, int from, int to) {
  TargetFeatures out;
  out.rows = to - from;
  out.width = out.rows > 0 ? all.width : 0;
  out.bf16.assign(all.bf16.begin() + static_cast<size_t>(from) * all.width,
                  all.bf16.begin() + static_cast<size_t>(to) * all.width);
  return out;
}

// The prefix cache: a session that ended leaves the full pages of its rows cached, keyed by
// their tokens; a session whose verifier offers the cached prefix of a prompt continuing that
// context takes them (in whole pages of both sides' sizes, up to the offer) and is sent only
// the rows after them, and drafts the very trees of a session given every row. A prompt the
// drafter never saw takes nothing.
TEST_F(DflashDrafterTest, ACachedPromptsRowsComeFromTheDraftersPrefixCache) {
  DflashDrafterFactory factory = NewFactory(DraftShape::kTree);
  std::vector<int32_t> context;
  for (int i = 0; i < 40; ++i) context.push_back(100 + (i * 7) % 50);
  const TargetFeatures all = Rows(60, 9);  // row i: the target's features at context token i
  {
    auto first = *factory.NewSession();
    ASSERT_TRUE(first->Append(TokenContext(context)).ok());
    ASSERT_TRUE(first->Append(DraftContext{{77}, RowsOf(all, 0, 40)}).ok());
    ASSERT_TRUE(first->Draft(SpecLimits{8, 4, 0}).ok());  // its 40 rows go into the model
  }  // ended: 2 full pages of 16 rows stay cached
  context.push_back(77);
  for (int i = 0; i < 10; ++i) context.push_back(200 + i);  // the next turn: 51 tokens

  auto warm = *factory.NewSession();
  // Offered 48 (the verifier's pages of 8): it holds 32.
  EXPECT_EQ(warm->ReuseCachedPrompt(context, 48, 8), 32);
  ASSERT_TRUE(warm->Append(TokenContext(context)).ok());
  ASSERT_TRUE(warm->Append(DraftContext{{300}, RowsOf(all, 32, 51)}).ok());
  auto cold = *NewFactory(DraftShape::kTree).NewSession();
  ASSERT_TRUE(cold->Append(TokenContext(context)).ok());
  ASSERT_TRUE(cold->Append(DraftContext{{300}, RowsOf(all, 0, 51)}).ok());
  const DraftedTree a = *warm->Draft(SpecLimits{16, 6, 0});
  const DraftedTree b = *cold->Draft(SpecLimits{16, 6, 0});
  ASSERT_FALSE(a.tokens.empty());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.parents, b.parents);
  EXPECT_EQ(a.logprobs, b.logprobs);

  // Less offered than held: the offer, in whole pages of both sizes (lcm(16, 24) = 48 > 24).
  auto partial = *factory.NewSession();
  EXPECT_EQ(partial->ReuseCachedPrompt(context, 16, 16), 16);
  auto uneven = *factory.NewSession();
  EXPECT_EQ(uneven->ReuseCachedPrompt(context, 24, 24), 0);
  std::vector<int32_t> other = context;
  other[0] = 4000;
  auto stranger = *factory.NewSession();
  EXPECT_EQ(stranger->ReuseCachedPrompt(other, 48, 16), 0);
}

TEST_F(DflashDrafterTest, TheBlockIsNoLongerThanTheDrafterWasTrainedFor) {
  DflashDrafterFactory factory = NewFactory(DraftShape::kChain);
  auto session = factory.NewSession();
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->Append(DraftContext{{5, 6}, {}}).ok());
  ASSERT_TRUE((*session)->Append(DraftContext{{7}, Rows(2, 3)}).ok());
  absl::StatusOr<DraftedTree> tree = (*session)->Draft(SpecLimits{64, 16, 0});
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(tree->tokens.size(), 7u);  // block_size 8: the bonus and 7 drafted positions
  TargetFeatures narrow = Rows(1, 4);
  narrow.width /= 2;
  narrow.bf16.resize(narrow.width);
  EXPECT_FALSE((*session)->Append(DraftContext{{8}, narrow}).ok());
}

}  // namespace
}  // namespace treespec
