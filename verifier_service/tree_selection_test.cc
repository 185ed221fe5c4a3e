#include "verifier_service/tree_selection.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pointwise;

// A step that costs `fixed` ms plus `per_node` ms per drafted node per sequence (linear, so the
// model's extension past its grid is exact).
StepCostModel LinearCost(double fixed, double per_node) {
  const StepCostGrid grid{{1, 8}, {0, 64}, {0, 4096}};
  std::vector<double> ms(grid.size());
  for (size_t b = 0; b < 2; ++b) {
    for (size_t d = 0; d < 2; ++d) {
      for (size_t c = 0; c < 2; ++c) ms[grid.Index(b, d, c)] = fixed + per_node * grid.drafted[d];
    }
  }
  return *StepCostModel::Create(grid, ms);
}

// Root a (p .5) with children b (.5 · .6) and c (.5 · .2); root d (.25) with child e (.25 · .9).
DraftedTree Example() {
  return {{10, 11, 12, 13, 14},
          {-1, 0, 0, -1, 3},
          {std::log(0.5f), std::log(0.6f), std::log(0.2f), std::log(0.25f), std::log(0.9f)}};
}

TEST(TreeSelectionTest, PathProbabilitiesMultiplyAlongThePath) {
  EXPECT_THAT(PathProbabilities(Example()),
              Pointwise(DoubleNear(1e-6), {0.5, 0.3, 0.1, 0.25, 0.225}));
  DraftedTree bare = Example();
  bare.logprobs.clear();  // the n-gram drafter's: children share their parent's chance
  EXPECT_THAT(PathProbabilities(bare), Pointwise(DoubleNear(1e-12), {0.5, 0.25, 0.25, 0.5, 0.5}));
}

TEST(TreeSelectionTest, KeepNodesRenumbersTheParents) {
  const DraftedTree kept = KeepNodes(Example(), {0, 2, 3, 4});
  EXPECT_THAT(kept.tokens, ElementsAre(10, 12, 13, 14));
  EXPECT_THAT(kept.parents, ElementsAre(-1, 0, -1, 2));
  EXPECT_EQ(kept.logprobs.size(), 4u);
}

TEST(TreeSelectionTest, CalibrationLearnsHowOftenEachDepthIsAccepted) {
  AcceptanceCalibration cal;
  EXPECT_DOUBLE_EQ(cal.Factor(DrafterKind::kDraftModel, 1), 1.0);
  // The drafter promises 0.9 at depth 1 and 0.8 at depth 2; depth 1 is accepted every other
  // step and depth 2 never.
  for (int step = 0; step < 600; ++step) {
    cal.Observe(DrafterKind::kDraftModel, {1, 2}, {0.9, 0.8}, step % 2 == 0 ? 1 : 0);
  }
  EXPECT_NEAR(cal.Factor(DrafterKind::kDraftModel, 1), 0.5 / 0.9, 0.02);
  EXPECT_DOUBLE_EQ(cal.Factor(DrafterKind::kDraftModel, 2), 1.0 / 16) << "clamped";
  EXPECT_DOUBLE_EQ(cal.Factor(DrafterKind::kDflash, 1), 1.0) << "kinds are calibrated apart";
  EXPECT_DOUBLE_EQ(cal.Factor(DrafterKind::kDraftModel, 3), 1.0) << "depths never drafted stay";
  EXPECT_NEAR(cal.Calibrated(DrafterKind::kDraftModel, 1, 0.9), 0.5, 0.02);
}

TEST(TreeSelectionTest, CheapNodesAreAllKeptWithinTheCapAndCostlyOnesNone) {
  const DraftedTree tree = Example();
  AcceptanceCalibration cal;
  const SelectionCandidate one{&tree, 100, 16, DrafterKind::kDraftModel};
  TreeSelection cheap = SelectNodes({&one, 1}, LinearCost(10, 0.01), cal);
  EXPECT_THAT(cheap.keep[0], ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(cheap.kept_depths[0], ElementsAre(1, 2, 2, 1, 2));
  EXPECT_THAT(cheap.kept_probs[0], Pointwise(DoubleNear(1e-6), {0.5, 0.3, 0.1, 0.25, 0.225}));
  EXPECT_NEAR(cheap.expected_tokens, 1 + 0.5 + 0.3 + 0.1 + 0.25 + 0.225, 1e-6);
  EXPECT_NEAR(cheap.predicted_ms, 10 + 0.05, 1e-9);
  // A cap of 3 keeps the three likeliest: a (.5), b (.3), d (.25).
  const SelectionCandidate capped{&tree, 100, 3, DrafterKind::kDraftModel};
  EXPECT_THAT(SelectNodes({&capped, 1}, LinearCost(10, 0.01), cal).keep[0], ElementsAre(0, 1, 3));
  // Saturated: each node costs as much as a whole step.
  TreeSelection costly = SelectNodes({&one, 1}, LinearCost(1, 1), cal);
  EXPECT_THAT(costly.keep[0], IsEmpty());
  EXPECT_DOUBLE_EQ(costly.expected_tokens, 1);
  // In between: a node pays while its chance beats the tokens per ms so far.
  TreeSelection some = SelectNodes({&one, 1}, LinearCost(1, 0.4), cal);
  EXPECT_THAT(some.keep[0], ElementsAre(0)) << "1.5 / 1.4 beats 1 / 1, 1.8 / 1.8 does not";
}

// A step that also prefills prompts is priced with their rows: where the verify trees alone sit
// on the flat part of the cost (the GEMMs bound by the weights) and the prompts push the step
// onto its steep part, each node costs what it costs in that larger step.
TEST(TreeSelectionTest, PromptsPrefilledInTheStepArePricedIn) {
  // Flat 10 ms up to 64 drafted nodes per sequence, then 4 ms per node per sequence.
  const StepCostGrid grid{{1, 8}, {0, 64, 128}, {0, 4096}};
  std::vector<double> ms(grid.size());
  for (size_t b = 0; b < 2; ++b) {
    for (size_t d = 0; d < 3; ++d) {
      for (size_t c = 0; c < 2; ++c) ms[grid.Index(b, d, c)] = d < 2 ? 10 : 10 + 64 * 4;
    }
  }
  const StepCostModel cost = *StepCostModel::Create(grid, ms);
  const DraftedTree tree = Example();
  AcceptanceCalibration cal;
  const SelectionCandidate one{&tree, 100, 16, DrafterKind::kDraftModel};
  EXPECT_THAT(SelectNodes({&one, 1}, cost, cal).keep[0], ElementsAre(0, 1, 2, 3, 4));
  // With a 129-token prompt beside it the step is two sequences of (k + 128) / 2 nodes each,
  // past the bend: each node costs 2 ms, which only the 0.5-chance node repays (2.5 tokens in
  // 12 ms beat 2 in 10; 2.8 in 14 do not).
  const TreeSelection crowded = SelectNodes({&one, 1}, cost, cal, {1, 129});
  EXPECT_THAT(crowded.keep[0], ElementsAre(0));
  EXPECT_NEAR(crowded.predicted_ms, 12, 1e-9);
  EXPECT_NEAR(crowded.expected_tokens, 2 + 0.5, 1e-9) << "the prompt's first token counts";
}

// The selection is the best prefix-closed choice within the caps: checked against every subset
// on small random trees.
TEST(TreeSelectionTest, MatchesExhaustiveSearchOnSmallTrees) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  AcceptanceCalibration cal;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<DraftedTree> trees(2);
    int total = 0;
    for (DraftedTree& t : trees) {
      const int m = 1 + static_cast<int>(rng() % 5);
      for (int j = 0; j < m; ++j) {
        t.tokens.push_back(j);
        t.parents.push_back(j == 0 ? -1 : static_cast<int>(rng() % (j + 1)) - 1);
        t.logprobs.push_back(std::log(u(rng)));
      }
      total += m;
    }
    const std::vector<SelectionCandidate> c{
        {&trees[0], 50, 1 + static_cast<int>(rng() % 5), DrafterKind::kDraftModel},
        {&trees[1], 70, 1 + static_cast<int>(rng() % 5), DrafterKind::kDflash}};
    const StepCostModel cost = LinearCost(1, 0.05 + 0.5 * (rng() % 100) / 100.0);
    const TreeSelection got = SelectNodes(c, cost, cal);
    const double got_rate = got.expected_tokens / got.predicted_ms;
    // Each candidate's share of the expectation: its kept nodes' chances.
    ASSERT_EQ(got.expected.size(), 2u);
    EXPECT_NEAR(got.expected[0] + got.expected[1], got.expected_tokens - 2, 1e-9);
    for (int i = 0; i < 2; ++i) {
      double sum = 0;
      for (size_t j = 0; j < got.keep[i].size(); ++j) sum += got.kept_probs[i][j];
      EXPECT_NEAR(got.expected[i], sum, 1e-9) << "a fresh calibration keeps the chances";
    }

    std::vector<std::vector<double>> p = {PathProbabilities(trees[0]), PathProbabilities(trees[1])};
    double best = 0;
    for (uint32_t mask = 0; mask < (1u << total); ++mask) {
      double tokens = 2;
      int k = 0;
      bool ok = true;
      for (int i = 0, bit = 0; i < 2 && ok; ++i) {
        int kept = 0;
        const int base = bit;
        for (size_t j = 0; j < trees[i].tokens.size(); ++j, ++bit) {
          if (!(mask >> bit & 1)) continue;
          const int parent = trees[i].parents[j];
          if (parent >= 0 && !(mask >> (base + parent) & 1)) ok = false;
          tokens += p[i][j];
          ++kept;
        }
        if (kept > c[i].cap) ok = false;
        k += kept;
      }
      if (ok) best = std::max(best, tokens / cost.PredictMs({2, k / 2.0, 60}));
    }
    EXPECT_NEAR(got_rate, best, 1e-9 * best) << "trial " << trial;
    // What was kept is prefix-closed and within the caps.
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(static_cast<int>(got.keep[i].size()), c[i].cap);
      for (int j : got.keep[i]) {
        const int parent = trees[i].parents[j];
        if (parent >= 0) {
          EXPECT_TRUE(std::binary_search(got.keep[i].begin(), got.keep[i].end(), parent));
        }
      }
    }
  }
}

}  // namespace
}  // namespace treespec
