#include "common/tree/token_tree.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

DraftedTree MakeTree(std::vector<int32_t> tokens, std::vector<int32_t> parents) {
  DraftedTree tree;
  tree.tokens = std::move(tokens);
  tree.parents = std::move(parents);
  return tree;
}

TEST(ValidateDraftedTreeTest, AcceptsWellFormedTrees) {
  EXPECT_TRUE(ValidateDraftedTree(DraftedTree{}, 10, 0, 0).ok());
  DraftedTree tree = MakeTree({1, 2, 3, 4}, {-1, 0, -1, 1});
  tree.logprobs = {-0.1f, -0.2f, -2.0f, -0.3f};
  EXPECT_TRUE(ValidateDraftedTree(tree, 10, 4, 3).ok());
}

TEST(ValidateDraftedTreeTest, RejectsSizeMismatch) {
  absl::Status s = ValidateDraftedTree(MakeTree({1, 2}, {-1}), 10, 8, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 tokens but 1 parents"));

  DraftedTree tree = MakeTree({1, 2}, {-1, 0});
  tree.logprobs = {-1.0f};
  s = ValidateDraftedTree(tree, 10, 8, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1 logprobs"));
}

TEST(ValidateDraftedTreeTest, RejectsBadParent) {
  absl::Status s = ValidateDraftedTree(MakeTree({1, 2, 3, 4, 5, 6}, {-1, 0, 1, 2, 3, 7}), 10, 8, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("draft tree node 5: parent 7 is not before the node"));

  s = ValidateDraftedTree(MakeTree({1, 2}, {-1, 1}), 10, 8, 8);  // self-parent
  EXPECT_THAT(s.message(), HasSubstr("node 1: parent 1 is not before"));
  s = ValidateDraftedTree(MakeTree({1}, {-2}), 10, 8, 8);
  EXPECT_THAT(s.message(), HasSubstr("node 0: parent -2"));
}

TEST(ValidateDraftedTreeTest, RejectsTokenOutOfRange) {
  absl::Status s = ValidateDraftedTree(MakeTree({1, 10}, {-1, 0}), 10, 8, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("node 1: token id 10 out of range [0, 10)"));
  s = ValidateDraftedTree(MakeTree({-3}, {-1}), 10, 8, 8);
  EXPECT_THAT(s.message(), HasSubstr("token id -3 out of range"));
}

TEST(ValidateDraftedTreeTest, RejectsOverBudgetAndTooDeep) {
  absl::Status s = ValidateDraftedTree(MakeTree({1, 2, 3}, {-1, -1, -1}), 10, 2, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("3 nodes, more than the budget of 2"));

  s = ValidateDraftedTree(MakeTree({1, 2, 3}, {-1, 0, 1}), 10, 8, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("node 2: depth 3 exceeds max_depth 2"));
  EXPECT_TRUE(ValidateDraftedTree(MakeTree({1, 2, 3}, {-1, 0, 1}), 10, 8, 3).ok());
}

TEST(ToVerifyTreeTest, PrependsBonusAndShiftsParents) {
  std::vector<int32_t> tokens, parents;
  ToVerifyTree(7, MakeTree({1, 2, 3}, {-1, 0, -1}), &tokens, &parents);
  EXPECT_THAT(tokens, ElementsAre(7, 1, 2, 3));
  EXPECT_THAT(parents, ElementsAre(-1, 0, 1, 0));

  ToVerifyTree(5, DraftedTree{}, &tokens, &parents);
  EXPECT_THAT(tokens, ElementsAre(5));
  EXPECT_THAT(parents, ElementsAre(-1));
}

TEST(NodeDepthsTest, TreeAndForest) {
  EXPECT_THAT(NodeDepths(std::vector<int32_t>{-1, 0, 1, 0, 3, 2}), ElementsAre(0, 1, 2, 1, 2, 3));
  EXPECT_THAT(NodeDepths(std::vector<int32_t>{-1, -1, 0, 1}), ElementsAre(0, 0, 1, 1));
  EXPECT_TRUE(NodeDepths(std::vector<int32_t>{}).empty());
}

// Reference: bit j of row i iff walking parents from i reaches j.
std::vector<uint64_t> NaiveAncestorMask(const std::vector<int32_t>& parents) {
  const size_t n = parents.size(), words = (n + 63) / 64;
  std::vector<uint64_t> mask(n * words, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t j = static_cast<int32_t>(i); j >= 0; j = parents[j]) {
      mask[i * words + j / 64] |= uint64_t{1} << (j % 64);
    }
  }
  return mask;
}

TEST(AllVisibleMaskTest, EveryRowSeesExactlyTheNNodes) {
  for (int n : {1, 5, 63, 64, 65, 130}) {
    const std::vector<uint64_t> mask = AllVisibleMask(n);
    const int words = (n + 63) / 64;
    ASSERT_EQ(mask.size(), static_cast<size_t>(n) * words) << n;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < words * 64; ++j) {
        const bool bit = (mask[static_cast<size_t>(i) * words + j / 64] >> (j % 64)) & 1;
        ASSERT_EQ(bit, j < n) << "n " << n << " row " << i << " bit " << j;
      }
    }
  }
}

TEST(AncestorMaskTest, SmallTree) {
  // 0 -> 1 -> 2, 0 -> 3
  std::vector<uint64_t> mask = AncestorMask(std::vector<int32_t>{-1, 0, 1, 0});
  EXPECT_THAT(mask, ElementsAre(0b0001, 0b0011, 0b0111, 0b1001));
}

TEST(AncestorMaskTest, ChainIsLowerTriangular) {
  const int n = 130;  // three words per row
  std::vector<int32_t> parents(n);
  for (int i = 0; i < n; ++i) parents[i] = i - 1;
  std::vector<uint64_t> mask = AncestorMask(parents);
  ASSERT_EQ(mask.size(), static_cast<size_t>(n * 3));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const bool bit = (mask[i * 3 + j / 64] >> (j % 64)) & 1;
      EXPECT_EQ(bit, j <= i) << i << "," << j;
    }
  }
}

TEST(AncestorMaskTest, RandomTreesMatchNaive) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 200);
    std::vector<int32_t> parents(n);
    for (int i = 0; i < n; ++i) {
      parents[i] = i == 0 ? -1 : static_cast<int32_t>(rng() % (i + 1)) - 1;  // forests too
    }
    EXPECT_EQ(AncestorMask(parents), NaiveAncestorMask(parents)) << "trial " << trial;
  }
}

TEST(WalkTreeTest, FollowsMatchingChildren) {
  // node: 0  1  2  3  4  5  6
  // tok:  9  5  6  7  8  5  4
  // par: -1  0  0  1  1  2  3
  std::vector<int32_t> tokens = {9, 5, 6, 7, 8, 5, 4};
  std::vector<int32_t> parents = {-1, 0, 0, 1, 1, 2, 3};
  // Target picks 6 at node 0, then 5 at node 2, then 1 at node 5 (a leaf).
  std::vector<int32_t> choice = {6, 0, 5, 0, 0, 1, 0};
  EXPECT_THAT(WalkTree(tokens, parents, choice), ElementsAre(0, 2, 5));
  // Target picks 5, 7, 4, and 3 at the leaf: the whole left branch.
  choice = {5, 7, 0, 4, 0, 0, 3};
  EXPECT_THAT(WalkTree(tokens, parents, choice), ElementsAre(0, 1, 3, 6));
  // No child matches at the root.
  choice = {1, 0, 0, 0, 0, 0, 0};
  EXPECT_THAT(WalkTree(tokens, parents, choice), ElementsAre(0));
}

TEST(WalkTreeTest, DoesNotJumpToNonChildren) {
  // Node 2 carries the chosen token but is a child of node 1, not of node 0.
  std::vector<int32_t> tokens = {0, 1, 2};
  std::vector<int32_t> parents = {-1, 0, 1};
  std::vector<int32_t> choice = {2, 2, 0};
  EXPECT_THAT(WalkTree(tokens, parents, choice), ElementsAre(0));
}

TEST(WalkTreeTest, DuplicateTokensFirstChildWins) {
  // Nodes 1 and 2 both carry token 4; only node 2 has a child with token 8.
  std::vector<int32_t> tokens = {0, 4, 4, 8};
  std::vector<int32_t> parents = {-1, 0, 0, 2};
  std::vector<int32_t> choice = {4, 8, 8, 1};
  EXPECT_THAT(WalkTree(tokens, parents, choice), ElementsAre(0, 1));
}

TEST(WalkTreeTest, SingleNodeAndChain) {
  EXPECT_THAT(WalkTree(std::vector<int32_t>{3}, std::vector<int32_t>{-1}, std::vector<int32_t>{3}),
              ElementsAre(0));
  std::vector<int32_t> tokens = {0, 1, 2, 3, 4};
  std::vector<int32_t> parents = {-1, 0, 1, 2, 3};
  EXPECT_THAT(WalkTree(tokens, parents, std::vector<int32_t>{1, 2, 9, 4, 5}), ElementsAre(0, 1, 2));
  EXPECT_THAT(WalkTree(tokens, parents, std::vector<int32_t>{1, 2, 3, 4, 5}),
              ElementsAre(0, 1, 2, 3, 4));
}

// Reference walk with explicit child search.
std::vector<int32_t> NaiveWalk(const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& parents,
                               const std::vector<int32_t>& choice) {
  std::vector<int32_t> path = {0};
  for (;;) {
    const int32_t cur = path.back();
    int32_t next = -1;
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (parents[j] == cur && tokens[j] == choice[cur]) {
        next = static_cast<int32_t>(j);
        break;
      }
    }
    if (next < 0) return path;
    path.push_back(next);
  }
}

TEST(WalkTreeTest, RandomTreesMatchNaive) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<int32_t> tokens(n), parents(n), choice(n);
    for (int i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % 3);
      parents[i] = i == 0 ? -1 : static_cast<int32_t>(rng() % i);
      choice[i] = static_cast<int32_t>(rng() % 3);
    }
    EXPECT_EQ(WalkTree(tokens, parents, choice), NaiveWalk(tokens, parents, choice));
  }
}

}  // namespace
}  // namespace treespec

namespace treespec {
namespace {

TEST(DraftedPathsTest, FollowsParents) {
  DraftedTree t;
  t.tokens = {10, 11, 12, 13};
  t.parents = {-1, 0, -1, 1};
  const std::vector<std::vector<int32_t>> paths = DraftedPaths(t);
  ASSERT_EQ(paths.size(), 4u);
  EXPECT_EQ(paths[0], (std::vector<int32_t>{10}));
  EXPECT_EQ(paths[1], (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(paths[2], (std::vector<int32_t>{12}));
  EXPECT_EQ(paths[3], (std::vector<int32_t>{10, 11, 13}));
}

}  // namespace
}  // namespace treespec
