#include "drafter_service/ddtree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Random normalised distribution over `vocab` tokens, as log-probs.
std::vector<float> RandomLogprobs(std::mt19937& rng, int vocab) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = u(rng);
  float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(x - max);
  const float lse = max + static_cast<float>(std::log(sum));
  for (float& x : logits) x -= lse;
  return logits;
}

TEST(TopKTest, MatchesSort) {
  std::mt19937 rng(1);
  std::vector<float> lp = RandomLogprobs(rng, 100);
  lp[3] = -std::numeric_limits<float>::infinity();
  std::vector<Candidate> top = PerDepthCandidates::TopK(lp, 10);
  std::vector<int> order(lp.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lp[a] > lp[b]; });
  ASSERT_EQ(top.size(), 10u);
  for (int r = 0; r < 10; ++r) {
    EXPECT_EQ(top[r].token, order[r]);
    EXPECT_EQ(top[r].logprob, lp[order[r]]);
  }
  // Large k (the selection path) agrees with sorting too.
  std::vector<float> big = RandomLogprobs(rng, 3000);
  for (int i = 0; i < 3000; i += 7) big[i] = big[i + 1];  // ties
  std::vector<Candidate> top_big = PerDepthCandidates::TopK(big, 200);
  std::vector<int> big_order(big.size());
  std::iota(big_order.begin(), big_order.end(), 0);
  std::stable_sort(big_order.begin(), big_order.end(),
                   [&](int a, int b) { return big[a] > big[b]; });
  ASSERT_EQ(top_big.size(), 200u);
  for (int r = 0; r < 200; ++r) EXPECT_EQ(top_big[r].token, big_order[r]) << r;
  // k beyond the finite entries: -inf entries are dropped.
  EXPECT_EQ(PerDepthCandidates::TopK(lp, 1000).size(), 99u);
  EXPECT_THAT(PerDepthCandidates::TopK(lp, 0), IsEmpty());
  // Ties: lower token id first.
  std::vector<Candidate> tied =
      PerDepthCandidates::TopK(std::vector<float>{-1, -0.5f, -1, -0.5f}, 3);
  EXPECT_EQ(tied[0].token, 1);
  EXPECT_EQ(tied[1].token, 3);
  EXPECT_EQ(tied[2].token, 0);
}

TEST(CandidatesOfTest, TakesTheFirstKInOrder) {
  const std::vector<TokenLogProb> ranked = {{7, -0.1f}, {2, -0.5f}, {9, -2.0f}};
  const std::vector<Candidate> two = CandidatesOf(ranked, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].token, 7);
  EXPECT_EQ(two[0].logprob, -0.1f);
  EXPECT_EQ(two[1].token, 2);
  EXPECT_EQ(two[1].logprob, -0.5f);
  EXPECT_EQ(two[0].key, 0);
  EXPECT_EQ(two[1].key, 0);
  EXPECT_EQ(CandidatesOf(ranked, 10).size(), 3u);  // k past the list: all of it
  EXPECT_THAT(CandidatesOf(ranked, 0), IsEmpty());
  EXPECT_THAT(CandidatesOf(ranked, -1), IsEmpty());
}

// On per-depth marginals the builder returns exactly the top-B prefixes by product of
// probabilities, found here by enumerating every prefix.
TEST(BuildDdTreeTest, PerDepthEqualsBruteForceTopB) {
  std::mt19937 rng(123);
  for (int trial = 0; trial < 30; ++trial) {
    const int vocab = 2 + static_cast<int>(rng() % 4);  // 2..5
    const int depth = 1 + static_cast<int>(rng() % 4);  // 1..4
    const int k = 1 + static_cast<int>(rng() % vocab);  // top-K per depth
    std::vector<std::vector<Candidate>> ranked;
    for (int d = 0; d < depth + 1; ++d) {  // one depth more than allowed: must stay unused
      ranked.push_back(PerDepthCandidates::TopK(RandomLogprobs(rng, vocab), k));
    }
    PerDepthCandidates source(ranked);

    // Enumerate all prefixes of length 1..depth over the top-K lists.
    std::vector<std::pair<double, std::vector<int32_t>>> all;
    std::vector<std::pair<double, std::vector<int32_t>>> level = {{0.0, {}}};
    for (int d = 0; d < depth; ++d) {
      std::vector<std::pair<double, std::vector<int32_t>>> next;
      for (const auto& [score, path] : level) {
        for (const Candidate& c : ranked[d]) {
          std::vector<int32_t> p = path;
          p.push_back(c.token);
          next.push_back({score + c.logprob, p});
        }
      }
      all.insert(all.end(), next.begin(), next.end());
      level = std::move(next);
    }
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });

    for (int budget : {1, 2, 3, 5, 8, 16, 40, 1000}) {
      DraftedTree tree = BuildDdTree(source, 0, SpecLimits{budget, depth});
      const size_t expected_size = std::min<size_t>(budget, all.size());
      ASSERT_EQ(tree.tokens.size(), expected_size) << "trial " << trial << " budget " << budget;
      std::set<std::vector<int32_t>> want, got;
      for (size_t i = 0; i < expected_size; ++i) want.insert(all[i].second);
      std::vector<std::vector<int32_t>> paths = DraftedPaths(tree);
      for (const auto& p : paths) got.insert(p);
      EXPECT_EQ(got, want) << "trial " << trial << " budget " << budget;
      ASSERT_TRUE(ValidateDraftedTree(tree, vocab, budget, depth).ok());
      // Conditional log-probs are those of the node's depth; pop order is by score.
      double last = 0;
      for (size_t j = 0; j < paths.size(); ++j) {
        const size_t d = paths[j].size() - 1;
        auto it = std::find_if(ranked[d].begin(), ranked[d].end(),
                               [&](const Candidate& c) { return c.token == tree.tokens[j]; });
        ASSERT_NE(it, ranked[d].end());
        EXPECT_EQ(tree.logprobs[j], it->logprob);
        double score = 0;
        for (int32_t a = static_cast<int32_t>(j); a >= 0; a = tree.parents[a]) {
          score += tree.logprobs[a];
        }
        EXPECT_LE(score, last + 1e-9);
        last = score;
      }
    }
  }
}

TEST(BuildDdTreeTest, BudgetAndDepthLimits) {
  std::mt19937 rng(5);
  std::vector<std::vector<Candidate>> ranked;
  for (int d = 0; d < 10; ++d)
    ranked.push_back(PerDepthCandidates::TopK(RandomLogprobs(rng, 6), 6));
  PerDepthCandidates source(ranked);

  EXPECT_THAT(BuildDdTree(source, 0, SpecLimits{0, 8}).tokens, IsEmpty());
  EXPECT_THAT(BuildDdTree(source, 0, SpecLimits{8, 0}).tokens, IsEmpty());
  // Depth 1: the best `budget` first tokens, all children of the bonus.
  DraftedTree flat = BuildDdTree(source, 0, SpecLimits{4, 1});
  EXPECT_THAT(flat.parents, ElementsAre(-1, -1, -1, -1));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(flat.tokens[r], ranked[0][r].token);
  // Budget larger than the whole depth-1 tree: stops when the heap is empty.
  EXPECT_EQ(BuildDdTree(source, 0, SpecLimits{100, 1}).tokens.size(), 6u);
  for (int depth = 1; depth <= 10; ++depth) {
    for (int budget : {1, 7, 16, 64}) {
      DraftedTree tree = BuildDdTree(source, 0, SpecLimits{budget, depth});
      size_t prefixes = 0;  // 6 + 6^2 + ... + 6^depth
      for (size_t d = 1, level = 6; d <= static_cast<size_t>(depth) && prefixes < 1000;
           ++d, level *= 6) {
        prefixes += level;
      }
      EXPECT_EQ(tree.tokens.size(), std::min<size_t>(budget, prefixes));
      EXPECT_TRUE(ValidateDraftedTree(tree, 6, budget, depth).ok());
    }
  }
  // Key out of range: no children.
  EXPECT_THAT(BuildDdTree(source, 99, SpecLimits{8, 8}).tokens, IsEmpty());
}

TEST(BuildDdTreeTest, ChainSourceGivesChain) {
  // One candidate per depth.
  std::vector<std::vector<Candidate>> ranked;
  for (int d = 0; d < 5; ++d) ranked.push_back({Candidate{10 + d, -0.1f * d, 0}});
  PerDepthCandidates source(ranked);
  DraftedTree tree = BuildDdTree(source, 0, SpecLimits{16, 8});
  EXPECT_THAT(tree.tokens, ElementsAre(10, 11, 12, 13, 14));  // runs out of depths
  EXPECT_THAT(tree.parents, ElementsAre(-1, 0, 1, 2, 3));
  tree = BuildDdTree(source, 0, SpecLimits{3, 8});
  EXPECT_THAT(tree.tokens, ElementsAre(10, 11, 12));
  tree = BuildDdTree(source, 0, SpecLimits{16, 2});
  EXPECT_THAT(tree.tokens, ElementsAre(10, 11));
}

TEST(BuildDdTreeTest, TiesAreDeterministic) {
  // Uniform over 2 tokens at every depth: every prefix of a depth ties with its cousins.
  const float lp = std::log(0.5f);
  std::vector<std::vector<Candidate>> ranked(3, {Candidate{7, lp, 0}, Candidate{8, lp, 0}});
  PerDepthCandidates source(ranked);
  DraftedTree tree = BuildDdTree(source, 0, SpecLimits{6, 3});
  // Shallower first, then by parent's output index, then by rank.
  EXPECT_THAT(tree.tokens, ElementsAre(7, 8, 7, 8, 7, 8));
  EXPECT_THAT(tree.parents, ElementsAre(-1, -1, 0, 0, 1, 1));
  for (int i = 0; i < 5; ++i) {
    DraftedTree again = BuildDdTree(source, 0, SpecLimits{6, 3});
    EXPECT_EQ(again.tokens, tree.tokens);
    EXPECT_EQ(again.parents, tree.parents);
  }
  // Zero log-probs (certain continuations, as from a single n-gram match): a chain first.
  std::vector<std::vector<Candidate>> certain(4, {Candidate{1, 0.0f, 0}});
  tree = BuildDdTree(PerDepthCandidates(certain), 0, SpecLimits{8, 8});
  EXPECT_THAT(tree.parents, ElementsAre(-1, 0, 1, 2));
}

// A hand-built trie source: keys index nodes.
class TrieSource final : public CandidateSource {
 public:
  std::vector<std::vector<Candidate>> children;
  absl::Span<const Candidate> Children(int32_t key) const override { return children[key]; }
};

TEST(BuildDdTreeTest, GeneralTreeSourceAndInfiniteLogprobs) {
  const float inf = std::numeric_limits<float>::infinity();
  TrieSource trie;
  trie.children.resize(6);
  // root(0) -> a(1, p .6), b(2, p .3), dead(5, p 0)
  trie.children[0] = {{100, std::log(0.6f), 1}, {200, std::log(0.3f), 2}, {300, -inf, 5}};
  // a -> c(3, p .9); b -> d(4, p .5)
  trie.children[1] = {{101, std::log(0.9f), 3}};
  trie.children[2] = {{201, std::log(0.5f), 4}};
  DraftedTree tree = BuildDdTree(trie, 0, SpecLimits{10, 4});
  // Scores: a .6, c .54, b .3, d .15; the -inf candidate is never drafted.
  EXPECT_THAT(tree.tokens, ElementsAre(100, 101, 200, 201));
  EXPECT_THAT(tree.parents, ElementsAre(-1, 0, -1, 2));
  EXPECT_FLOAT_EQ(tree.logprobs[1], std::log(0.9f));
}

}  // namespace
}  // namespace treespec
