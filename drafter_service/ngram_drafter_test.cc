#include "drafter_service/ngram_drafter.h"

#include <chrono>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

DraftedTree DraftAfter(const std::vector<int32_t>& context, SpecLimits limits,
                       NgramOptions options = {}) {
  NgramDraftSession session(options);
  EXPECT_TRUE(session.Append(TokenContext(context)).ok());
  absl::StatusOr<DraftedTree> tree = session.Draft(limits);
  EXPECT_TRUE(tree.ok()) << tree.status();
  return *tree;
}

TEST(NgramDrafterTest, RepetitiveTextGivesTheChain) {
  // "1 2 3" occurred once before, followed by 4 5 1 2 3.
  // Past the end of the context the copy repeats with period 5.
  DraftedTree tree = DraftAfter({1, 2, 3, 4, 5, 1, 2, 3}, SpecLimits{16, 8});
  EXPECT_THAT(tree.tokens, ElementsAre(4, 5, 1, 2, 3, 4, 5, 1));
  EXPECT_THAT(tree.parents, ElementsAre(-1, 0, 1, 2, 3, 4, 5, 6));
  EXPECT_THAT(tree.logprobs, ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));  // one occurrence: certain
  // Depth limit.
  tree = DraftAfter({1, 2, 3, 4, 5, 1, 2, 3}, SpecLimits{16, 2});
  EXPECT_THAT(tree.tokens, ElementsAre(4, 5));
}

TEST(NgramDrafterTest, PeriodicTextOverlapsItsOwnSuffix) {
  // a b a b a b: the continuation may run into the matched suffix itself.
  DraftedTree tree = DraftAfter({7, 8, 7, 8, 7, 8}, SpecLimits{4, 4});
  EXPECT_THAT(tree.tokens, ElementsAre(7, 8, 7, 8));
  EXPECT_THAT(tree.parents, ElementsAre(-1, 0, 1, 2));
}

TEST(NgramDrafterTest, BranchesWhereContinuationsDiffer) {
  // "1 2" was followed by 3 (twice) and 4 (once); after "1 2 3" came 9 and, more recently, 8.
  const std::vector<int32_t> context = {1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 8, 1, 2};
  DraftedTree tree = DraftAfter(context, SpecLimits{16, 2});
  ASSERT_GE(tree.tokens.size(), 4u);
  EXPECT_EQ(tree.tokens[0], 3);
  EXPECT_EQ(tree.parents[0], -1);
  EXPECT_FLOAT_EQ(tree.logprobs[0], std::log(2.0f / 3.0f));
  std::vector<int32_t> first_level, under_three;
  for (size_t j = 0; j < tree.tokens.size(); ++j) {
    if (tree.parents[j] == -1) first_level.push_back(tree.tokens[j]);
    if (tree.parents[j] == 0) {
      under_three.push_back(tree.tokens[j]);
      EXPECT_FLOAT_EQ(tree.logprobs[j], std::log(0.5f));
    }
    if (tree.tokens[j] == 4 && tree.parents[j] == -1) {
      EXPECT_FLOAT_EQ(tree.logprobs[j], std::log(1.0f / 3.0f));
    }
  }
  EXPECT_THAT(first_level, ElementsAre(3, 4));
  EXPECT_THAT(under_three, ElementsAre(8, 9));  // equal counts: most recent first
  EXPECT_EQ(tree.tokens.size(), 5u);            // 3, 4, 3>8, 3>9, 4>9
  EXPECT_TRUE(ValidateDraftedTree(tree, 10, 16, 2).ok());
}

TEST(NgramDrafterTest, PrefersTheLongestMatchingSuffix) {
  // Suffix "5 6": the 2-gram occurred once (then 7); the 1-gram "6" also preceded 9 later.
  DraftedTree tree = DraftAfter({5, 6, 7, 1, 6, 9, 2, 5, 6}, SpecLimits{8, 1});
  EXPECT_THAT(tree.tokens, ElementsAre(7));
  // max_ngram 1: only "6" counts; both continuations, the most recent (9) ranked first.
  NgramOptions unigram;
  unigram.max_ngram = 1;
  tree = DraftAfter({5, 6, 7, 1, 6, 9, 2, 5, 6}, SpecLimits{8, 1}, unigram);
  EXPECT_THAT(tree.tokens, ElementsAre(9, 7));
}

TEST(NgramDrafterTest, EmptyTreeWhenNothingMatches) {
  EXPECT_THAT(DraftAfter({}, SpecLimits{16, 8}).tokens, IsEmpty());
  EXPECT_THAT(DraftAfter({4}, SpecLimits{16, 8}).tokens, IsEmpty());
  EXPECT_THAT(DraftAfter({1, 2, 3, 4}, SpecLimits{16, 8}).tokens, IsEmpty());
  EXPECT_THAT(DraftAfter({1, 2, 1, 2}, SpecLimits{0, 8}).tokens, IsEmpty());
  NgramOptions bigram_only;
  bigram_only.min_ngram = 2;
  EXPECT_THAT(DraftAfter({1, 2, 3, 2}, SpecLimits{16, 8}, bigram_only).tokens, IsEmpty());
}

TEST(NgramDrafterTest, OptionsValidation) {
  EXPECT_TRUE(ValidateNgramOptions(NgramOptions{}).ok());
  EXPECT_FALSE(ValidateNgramOptions(NgramOptions{0, 4, 64}).ok());
  EXPECT_FALSE(ValidateNgramOptions(NgramOptions{3, 2, 64}).ok());
  EXPECT_FALSE(ValidateNgramOptions(NgramOptions{1, 4, 0}).ok());
}

// Every drafted path must be what followed some earlier occurrence of the longest matching
// suffix, and incremental appends must index exactly like one big append.
TEST(NgramDrafterTest, RandomContextsDraftOnlyObservedContinuations) {
  std::mt19937 rng(99);
  NgramOptions options;
  for (int trial = 0; trial < 200; ++trial) {
    const int size = 2 + static_cast<int>(rng() % 300);
    const int vocab = 2 + static_cast<int>(rng() % 6);
    std::vector<int32_t> context(size);
    for (int32_t& t : context) t = static_cast<int32_t>(rng() % vocab);
    const SpecLimits limits{1 + static_cast<int>(rng() % 32), 1 + static_cast<int>(rng() % 8)};

    NgramDraftSession pieces(options);
    for (size_t i = 0; i < context.size();) {
      const size_t len = std::min<size_t>(1 + rng() % 7, context.size() - i);
      ASSERT_TRUE(pieces.Append(TokenContext(absl::MakeConstSpan(context.data() + i, len))).ok());
      i += len;
    }
    DraftedTree tree = *pieces.Draft(limits);
    DraftedTree whole = DraftAfter(context, limits);
    EXPECT_EQ(tree.tokens, whole.tokens);
    EXPECT_EQ(tree.parents, whole.parents);
    ASSERT_TRUE(ValidateDraftedTree(tree, vocab, limits.tree_budget, limits.max_depth).ok());

    // Longest suffix with an earlier occurrence, by brute force.
    int n_best = 0;
    for (int n = std::min(options.max_ngram, size - 1); n >= 1 && n_best == 0; --n) {
      for (int e = n; e < size; ++e) {
        if (std::equal(context.begin() + e - n, context.begin() + e, context.end() - n)) {
          n_best = n;
          break;
        }
      }
    }
    EXPECT_EQ(tree.tokens.empty(), n_best == 0);
    std::vector<std::vector<int32_t>> paths(tree.tokens.size());
    for (size_t j = 0; j < tree.tokens.size(); ++j) {
      if (tree.parents[j] >= 0) paths[j] = paths[tree.parents[j]];
      paths[j].push_back(tree.tokens[j]);
      bool seen = false;
      for (int e = n_best; e < size && !seen; ++e) {
        if (!std::equal(context.begin() + e - n_best, context.begin() + e,
                        context.end() - n_best)) {
          continue;
        }
        // What followed position e, extended periodically past the end of the context.
        std::vector<int32_t> follow(context.begin() + e, context.end());
        while (follow.size() < paths[j].size())
          follow.push_back(follow[follow.size() - (size - e)]);
        seen = std::equal(paths[j].begin(), paths[j].end(), follow.begin());
      }
      EXPECT_TRUE(seen) << "trial " << trial << " node " << j;
      EXPECT_LE(tree.logprobs[j], 0.0f);
    }
  }
}

TEST(NgramDrafterTest, LongContextIsFast) {
  std::mt19937 rng(3);
  std::vector<int32_t> context(50000);
  for (int32_t& t : context) t = static_cast<int32_t>(rng() % 50);  // many repeats
  NgramDraftSession session(NgramOptions{});
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(session.Append(TokenContext(context)).ok());
  const auto t1 = std::chrono::steady_clock::now();
  int drafted = 0;
  const int steps = 200;
  for (int s = 0; s < steps; ++s) {
    DraftedTree tree = *session.Draft(SpecLimits{16, 8});
    drafted += static_cast<int>(tree.tokens.size());
    ASSERT_TRUE(
        session.Append(TokenContext(std::vector<int32_t>{static_cast<int32_t>(rng() % 50)})).ok());
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double append_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  const double step_us = std::chrono::duration<double, std::micro>(t2 - t1).count() / steps;
  std::printf("ngram: append 50k tokens %.0f us, draft+append per step %.1f us, %.1f nodes\n",
              append_us, step_us, static_cast<double>(drafted) / steps);
  EXPECT_GT(drafted, 0);
  EXPECT_LT(step_us, 5000.0);  // generous: catches accidental O(context) scans
}

}  // namespace
}  // namespace treespec
