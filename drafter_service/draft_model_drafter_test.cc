#include "drafter_service/draft_model_drafter.h"

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "drafter_service/ddtree.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::IsEmpty;

std::unique_ptr<CausalLm> MakeLm(const ModelConfig& config, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<CausalLm>> lm =
      CreateCpuCausalLm(config, testing::RandomWeights(config, seed), LmOptions{});
  EXPECT_TRUE(lm.ok()) << lm.status();
  return *std::move(lm);
}

// The draft model's log p(. | context) by one causal forward on a fresh sequence.
std::vector<float> CausalLogprobs(CausalLm& lm, const std::vector<int32_t>& context) {
  SeqTree chain;
  chain.seq = lm.CreateSequence();
  chain.tokens = context;
  for (size_t i = 0; i < context.size(); ++i) chain.parents.push_back(static_cast<int32_t>(i) - 1);
  absl::StatusOr<std::vector<float>> logits = lm.Forward(absl::MakeConstSpan(&chain, 1));
  EXPECT_TRUE(logits.ok()) << logits.status();
  lm.FreeSequence(chain.seq);
  const int vocab = lm.config().vocab_size;
  std::vector<float> out(vocab);
  LogSoftmax(absl::MakeConstSpan(logits->data() + (context.size() - 1) * vocab, vocab),
             absl::MakeSpan(out));
  return out;
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % vocab);
  return out;
}

class DraftModelDrafterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = testing::SmallLlamaConfig();  // 2 layers x 128, vocab 512, window 256
    reference_ = MakeLm(config_, 7);
  }
  std::unique_ptr<DraftModelDrafterFactory> Factory(DraftShape shape) {
    DraftModelOptions options;
    options.shape = shape;
    options.append_chunk = 16;  // several chunks for the longer prompts
    return std::make_unique<DraftModelDrafterFactory>(MakeLm(config_, 7), options);
  }

  // A session of a factory with `options` (kept by the fixture) after `context` was appended;
  // null if the append failed.
  std::unique_ptr<DraftSession> OpenWith(const DraftModelOptions& options,
                                         const std::vector<int32_t>& context) {
    factories_.push_back(std::make_unique<DraftModelDrafterFactory>(MakeLm(config_, 7), options));
    auto session = *factories_.back()->NewSession();
    const absl::Status appended = session->Append(TokenContext(context));
    EXPECT_TRUE(appended.ok()) << appended;
    return appended.ok() ? std::move(session) : nullptr;
  }

  ModelConfig config_;
  std::unique_ptr<CausalLm> reference_;  // same weights, for causal reference forwards
  std::vector<std::unique_ptr<DraftModelDrafterFactory>> factories_;
};

TEST_F(DraftModelDrafterTest, ChainIsGreedyDecoding) {
  auto factory = Factory(DraftShape::kChain);
  auto session = *factory->NewSession();
  std::vector<int32_t> context = RandomTokens(37, config_.vocab_size, 1);
  ASSERT_TRUE(session->Append(TokenContext(context)).ok());
  DraftedTree tree = *session->Draft(SpecLimits{16, 8});
  ASSERT_EQ(tree.tokens.size(), 8u);
  for (int d = 0; d < 8; ++d) {
    std::vector<float> lp = CausalLogprobs(*reference_, context);
    const int32_t greedy =
        static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    EXPECT_EQ(tree.tokens[d], greedy) << "depth " << d + 1;
    EXPECT_EQ(tree.parents[d], d - 1);
    EXPECT_NEAR(tree.logprobs[d], lp[greedy], 1e-5f);
    context.push_back(tree.tokens[d]);
  }
  // Budget smaller than depth: budget wins.
  EXPECT_EQ(session->Draft(SpecLimits{3, 8})->tokens.size(), 3u);
}

// A CandidateSource that asks the reference model lazily: the exact best-first tree over the
// draft model's top-K children, computed without any of the drafter's pruning.
class LazyModelSource final : public CandidateSource {
 public:
  LazyModelSource(CausalLm& lm, std::vector<int32_t> context, int k) : lm_(lm), k_(k) {
    paths_.push_back(std::move(context));
  }
  absl::Span<const Candidate> Children(int32_t key) const override {
    auto it = children_.find(key);
    if (it == children_.end()) {
      std::vector<Candidate> kids = PerDepthCandidates::TopK(CausalLogprobs(lm_, paths_[key]), k_);
      for (Candidate& c : kids) {
        c.key = static_cast<int32_t>(paths_.size());
        std::vector<int32_t> path = paths_[key];
        path.push_back(c.token);
        paths_.push_back(std::move(path));
      }
      it = children_.emplace(key, std::move(kids)).first;
    }
    return it->second;
  }

 private:
  CausalLm& lm_;
  const int k_;
  mutable std::vector<std::vector<int32_t>> paths_;  // [key] context + path
  mutable std::map<int32_t, std::vector<Candidate>> children_;
};

TEST_F(DraftModelDrafterTest, TreeIsTheExactBestFirstTreeWithTrueLogprobs) {
  for (int top_k : {0, 3}) {
    auto factory = Factory(DraftShape::kTree);
    auto session = *factory->NewSession();
    const std::vector<int32_t> context = RandomTokens(29, config_.vocab_size, 2);
    ASSERT_TRUE(session->Append(TokenContext(context)).ok());
    for (SpecLimits limits :
         {SpecLimits{16, 8, top_k}, SpecLimits{10, 3, top_k}, SpecLimits{5, 1, top_k}}) {
      DraftedTree tree = *session->Draft(limits);
      ASSERT_TRUE(
          ValidateDraftedTree(tree, config_.vocab_size, limits.tree_budget, limits.max_depth).ok());
      if (top_k == 0) EXPECT_EQ(tree.tokens.size(), static_cast<size_t>(limits.tree_budget));
      // Each node's log-prob is the draft model's conditional given its whole path.
      std::vector<std::vector<int32_t>> paths = DraftedPaths(tree);
      for (size_t j = 0; j < tree.tokens.size(); j += 3) {
        std::vector<int32_t> prefix = context;
        prefix.insert(prefix.end(), paths[j].begin(), paths[j].end() - 1);
        EXPECT_NEAR(tree.logprobs[j], CausalLogprobs(*reference_, prefix)[tree.tokens[j]], 1e-5f)
            << "node " << j;
      }
      // Same tree as an unpruned best-first search over the model.
      const int k = top_k > 0 ? top_k : std::min(limits.tree_budget, config_.vocab_size);
      LazyModelSource lazy(*reference_, context, k);
      DraftedTree want = BuildDdTree(lazy, 0, limits);
      EXPECT_EQ(tree.tokens, want.tokens) << "top_k " << top_k;
      EXPECT_EQ(tree.parents, want.parents) << "top_k " << top_k;
    }
  }
}

TEST_F(DraftModelDrafterTest, CappedExpansionStillGivesTrueLogprobs) {
  const std::vector<int32_t> context = RandomTokens(25, config_.vocab_size, 9);
  std::unique_ptr<DraftSession> session = OpenWith({.max_expand_per_depth = 2}, context);
  ASSERT_TRUE(session);
  DraftedTree tree = *session->Draft(SpecLimits{16, 8});
  ASSERT_TRUE(ValidateDraftedTree(tree, config_.vocab_size, 16, 8).ok());
  EXPECT_EQ(tree.tokens.size(), 16u);
  std::vector<std::vector<int32_t>> paths = DraftedPaths(tree);
  std::vector<int> children(tree.tokens.size() + 1, 0);  // [parent + 1]
  for (size_t j = 0; j < tree.tokens.size(); ++j) {
    ++children[tree.parents[j] + 1];
    std::vector<int32_t> prefix = context;
    prefix.insert(prefix.end(), paths[j].begin(), paths[j].end() - 1);
    EXPECT_NEAR(tree.logprobs[j], CausalLogprobs(*reference_, prefix)[tree.tokens[j]], 1e-5f);
  }
  // At most two nodes per depth have children.
  std::vector<int> parents_at_depth(9, 0);
  for (size_t j = 0; j < tree.tokens.size(); ++j) {
    if (children[j + 1] > 0) ++parents_at_depth[paths[j].size()];
  }
  for (int d = 1; d <= 8; ++d) EXPECT_LE(parents_at_depth[d], 2) << "depth " << d;
}

TEST_F(DraftModelDrafterTest, AppendAfterDraftContinuesCorrectly) {
  for (DraftShape shape : {DraftShape::kTree, DraftShape::kChain}) {
    auto factory = Factory(shape);
    auto session = *factory->NewSession();
    std::vector<int32_t> context = RandomTokens(40, config_.vocab_size, 3);
    ASSERT_TRUE(session->Append(TokenContext(context)).ok());
    for (int step = 0; step < 5; ++step) {
      DraftedTree tree = *session->Draft(SpecLimits{12, 6});
      ASSERT_FALSE(tree.tokens.empty());
      // Accept the first drafted token (if the step is even) plus a new bonus.
      std::vector<int32_t> emitted;
      if (step % 2 == 0) emitted.push_back(tree.tokens[0]);
      emitted.push_back(static_cast<int32_t>((step * 31 + 5) % config_.vocab_size));
      ASSERT_TRUE(session->Append(TokenContext(emitted)).ok());
      context.insert(context.end(), emitted.begin(), emitted.end());
    }
    auto* model_session = static_cast<DraftModelSession*>(session.get());
    EXPECT_EQ(model_session->committed_len(), static_cast<int>(context.size()));
    // A fresh session given the whole context at once drafts the very same tree.
    auto fresh = *factory->NewSession();
    ASSERT_TRUE(fresh->Append(TokenContext(context)).ok());
    DraftedTree a = *session->Draft(SpecLimits{12, 6});
    DraftedTree b = *fresh->Draft(SpecLimits{12, 6});
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.parents, b.parents);
    EXPECT_EQ(a.logprobs, b.logprobs);
  }
}

// The prefix cache: a session that ended leaves its context's full pages cached; a new session
// whose prompt continues that context (a conversation's next turn) attaches them, computes the
// rest, and drafts the very trees of a session without the cache (bit for bit on the CPU).
TEST_F(DraftModelDrafterTest, APromptContinuingAnEndedSessionReusesItsCachedPages) {
  auto factory = Factory(DraftShape::kTree);  // the prefix cache is on by default
  std::vector<int32_t> context = RandomTokens(40, config_.vocab_size, 11);
  {
    auto first = *factory->NewSession();
    ASSERT_TRUE(first->Append(TokenContext(context)).ok());
    EXPECT_EQ(first->cached_prompt_tokens(), 0);
    ASSERT_TRUE(first->Draft(SpecLimits{12, 6}).ok());
    const std::vector<int32_t> emitted = {5, 9, 13};
    ASSERT_TRUE(first->Append(TokenContext(emitted)).ok());
    context.insert(context.end(), emitted.begin(), emitted.end());
  }  // 43 tokens: 2 full pages of 16 stay cached
  std::vector<int32_t> turn = context;
  for (int32_t t : RandomTokens(10, config_.vocab_size, 12)) turn.push_back(t);
  auto warm = *factory->NewSession();
  ASSERT_TRUE(warm->Append(TokenContext(turn)).ok());
  EXPECT_EQ(warm->cached_prompt_tokens(), 32);
  DraftModelOptions cold_options;
  cold_options.append_chunk = 16;
  cold_options.prefix_cache = false;
  std::unique_ptr<DraftSession> cold = OpenWith(cold_options, turn);
  ASSERT_TRUE(cold);
  EXPECT_FALSE(cold->cached_prompt_tokens().has_value());
  for (int step = 0; step < 3; ++step) {
    const DraftedTree a = *warm->Draft(SpecLimits{12, 6});
    const DraftedTree b = *cold->Draft(SpecLimits{12, 6});
    ASSERT_FALSE(a.tokens.empty());
    EXPECT_EQ(a.tokens, b.tokens) << "step " << step;
    EXPECT_EQ(a.parents, b.parents);
    EXPECT_EQ(a.logprobs, b.logprobs);
    const std::vector<int32_t> emitted = {a.tokens[0], static_cast<int32_t>(step + 3)};
    ASSERT_TRUE(warm->Append(TokenContext(emitted)).ok());
    ASSERT_TRUE(cold->Append(TokenContext(emitted)).ok());
  }
  // A prompt that shares nothing attaches nothing.
  auto other = *factory->NewSession();
  ASSERT_TRUE(other->Append(TokenContext(RandomTokens(40, config_.vocab_size, 13))).ok());
  EXPECT_EQ(other->cached_prompt_tokens(), 0);
}

TEST_F(DraftModelDrafterTest, LimitsEmptyContextAndBadTokens) {
  auto factory = Factory(DraftShape::kTree);
  auto session = *factory->NewSession();
  EXPECT_THAT(session->Draft(SpecLimits{16, 8})->tokens, IsEmpty());  // nothing appended
  ASSERT_TRUE(session->Append(TokenContext(RandomTokens(10, config_.vocab_size, 4))).ok());
  EXPECT_THAT(session->Draft(SpecLimits{0, 8})->tokens, IsEmpty());
  DraftedTree flat = *session->Draft(SpecLimits{7, 1});
  EXPECT_EQ(flat.tokens.size(), 7u);
  for (int32_t p : flat.parents) EXPECT_EQ(p, -1);
  EXPECT_EQ(session->Draft(SpecLimits{1, 8})->tokens.size(), 1u);

  absl::Status bad = session->Append(TokenContext(std::vector<int32_t>{3, config_.vocab_size}));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("token id 512 out of range"));
}

TEST_F(DraftModelDrafterTest, MaxTopKCapsTheChildrenOfTheBonus) {
  const std::vector<int32_t> context = RandomTokens(21, config_.vocab_size, 8);
  std::unique_ptr<DraftSession> session = OpenWith({.max_top_k = 2}, context);
  ASSERT_TRUE(session);
  const DraftedTree flat = *session->Draft(SpecLimits{16, 1});
  const std::vector<Candidate> best =
      PerDepthCandidates::TopK(CausalLogprobs(*reference_, context), 2);
  ASSERT_EQ(flat.tokens.size(), 2u);  // the budget asks for 16
  EXPECT_EQ(flat.tokens[0], best[0].token);
  EXPECT_EQ(flat.tokens[1], best[1].token);
  // Deeper levels are not capped: every node's children come from a forward of its own.
  const DraftedTree deep = *session->Draft(SpecLimits{16, 8});
  EXPECT_EQ(deep.tokens.size(), 16u);
  int roots = 0;
  for (int32_t p : deep.parents) roots += p == -1;
  EXPECT_LE(roots, 2);
}

TEST_F(DraftModelDrafterTest, ContextWindowEndsDraftingGracefully) {
  auto factory = Factory(DraftShape::kTree);
  auto session = *factory->NewSession();
  const int window = config_.max_position_embeddings;
  ASSERT_TRUE(session->Append(TokenContext(RandomTokens(window - 3, config_.vocab_size, 5))).ok());
  // Nodes above the deepest level must fit in the window: depth <= window - L + 1 = 4.
  DraftedTree tree = *session->Draft(SpecLimits{16, 8});
  EXPECT_TRUE(ValidateDraftedTree(tree, config_.vocab_size, 16, 4).ok());
  ASSERT_TRUE(
      session->Append(TokenContext(RandomTokens(3, config_.vocab_size, 6))).ok());  // exactly full
  EXPECT_TRUE(
      ValidateDraftedTree(*session->Draft(SpecLimits{16, 8}), config_.vocab_size, 16, 1).ok());
  ASSERT_TRUE(
      session->Append(TokenContext(RandomTokens(2, config_.vocab_size, 7))).ok());  // beyond
  EXPECT_THAT(session->Draft(SpecLimits{16, 8})->tokens, IsEmpty());
}

TEST_F(DraftModelDrafterTest, ConcurrentSessionsShareTheModel) {
  auto factory = Factory(DraftShape::kTree);
  const int kThreads = 4;
  std::vector<std::vector<int32_t>> got(kThreads), want(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    auto session = *factory->NewSession();
    session->Append(TokenContext(RandomTokens(30 + t, config_.vocab_size, 10 + t))).IgnoreError();
    want[t] = session->Draft(SpecLimits{16, 8})->tokens;
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto session = *factory->NewSession();
      session->Append(TokenContext(RandomTokens(30 + t, config_.vocab_size, 10 + t))).IgnoreError();
      for (int i = 0; i < 3; ++i) got[t] = session->Draft(SpecLimits{16, 8})->tokens;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], want[t]) << "thread " << t;
}

}  // namespace
}  // namespace treespec
