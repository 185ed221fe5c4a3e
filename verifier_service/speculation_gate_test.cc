#include "verifier_service/speculation_gate.h"

#include <random>

#include "gtest/gtest.h"

namespace treespec {
namespace {

constexpr DraftSourceKind kDraftModel = DrafterKind::kDraftModel;

// A request that speculates gains `tree_tokens` per `tree_ms`, one that does not 1 token per
// `plain_ms` (±10 % noise); runs `steps` decisions and returns the share of time spent with a
// tree, and the tokens per ms achieved.
// The simulated clock.
double clock_ms = 0;
absl::Time Now() { return absl::UnixEpoch() + absl::Milliseconds(clock_ms); }

// One step of `ms` ending now on the simulated clock.
bool Step(SpeculationGate& gate, int running, bool tree, int tokens, double ms) {
  const absl::Time start = Now();
  clock_ms += ms;
  return gate.Observe(kDraftModel, running, tree, tokens, start, Now());
}

struct Outcome {
  double tree_time_share = 0;
  double rate = 0;
};
Outcome Simulate(SpeculationGate& gate, int running, double tree_tokens, double tree_ms,
                 double plain_ms, int steps, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  double tree_time = 0, time = 0, tokens = 0;
  for (int i = 0; i < steps; ++i) {
    const bool tree = gate.WantsTree(kDraftModel, running);
    const double ms = (tree ? tree_ms : plain_ms) * noise(rng);
    const int got = tree ? static_cast<int>(tree_tokens * noise(rng) + 0.5) : 1;
    const absl::Time start = Now();
    clock_ms += ms;
    gate.Observe(kDraftModel, running, tree, got, start, Now());
    time += ms;
    tokens += got;
    if (tree) tree_time += ms;
  }
  return {tree_time / time, tokens / time};
}

TEST(SpeculationGateTest, BucketsArePowersOfTwo) {
  EXPECT_EQ(SpeculationGate::Bucket(1), 0);
  EXPECT_EQ(SpeculationGate::Bucket(2), 1);
  EXPECT_EQ(SpeculationGate::Bucket(3), 2);
  EXPECT_EQ(SpeculationGate::Bucket(4), 2);
  EXPECT_EQ(SpeculationGate::Bucket(5), 3);
  EXPECT_EQ(SpeculationGate::Bucket(64), 6);
}

TEST(SpeculationGateTest, TriesTheTreeFirstThenPlain) {
  SpeculationGate gate;
  for (int i = 0; i < SpeculationGate::kMinSamples; ++i) {
    ASSERT_TRUE(gate.WantsTree(kDraftModel, 1));
    EXPECT_EQ(Step(gate, 1, true, 3, 1.0), i == SpeculationGate::kMinSamples - 1);
  }
  for (int i = 0; i < SpeculationGate::kMinSamples; ++i) {
    ASSERT_FALSE(gate.WantsTree(kDraftModel, 1));
    Step(gate, 1, false, 1, 1.0);
  }
  EXPECT_NEAR(gate.Rate(kDraftModel, 1, true), 3.0, 1e-9);
  EXPECT_NEAR(gate.Rate(kDraftModel, 1, false), 1.0, 1e-9);
  EXPECT_TRUE(gate.WantsTree(kDraftModel, 1));
}

// A drafter whose round trip costs more than its accepted tokens save (the tiny pair on a GPU):
// the gate settles on plain steps and spends only its probes on trees.
TEST(SpeculationGateTest, SettlesOnPlainWhenWaitingForTreesLoses) {
  SpeculationGate gate;
  // A tree: 3 tokens per 1.2 ms (0.2 ms step + 1 ms round trip); plain: 1 per 0.2 ms.
  const Outcome o = Simulate(gate, 1, 3, 1.2, 0.2, 5000);
  EXPECT_LT(o.tree_time_share, 0.05);
  EXPECT_GT(o.rate, 0.95 * (1 / 0.2));
  EXPECT_LT(gate.Rate(kDraftModel, 1, true), gate.Rate(kDraftModel, 1, false));
}

TEST(SpeculationGateTest, SettlesOnTreesWhenTheyPay) {
  SpeculationGate gate;
  // A tree: 4 tokens per 6 ms (an 8B target's step + a replayed draft); plain: 1 per 5 ms.
  const Outcome o = Simulate(gate, 1, 4, 6, 5, 5000);
  EXPECT_GT(o.tree_time_share, 0.97);
  EXPECT_GT(o.rate, 0.97 * (4.0 / 6));
}

// The probes notice a change: the drafter speeds up, and the gate moves to trees.
TEST(SpeculationGateTest, ProbesFollowAChange) {
  SpeculationGate gate;
  Simulate(gate, 4, 3, 1.2, 0.2, 2000);
  const Outcome after = Simulate(gate, 4, 3, 0.3, 0.2, 20000, 2);
  EXPECT_GT(after.rate, 0.9 * (3 / 0.3));
}

TEST(SpeculationGateTest, LoadsAndKindsAreKeptApart) {
  SpeculationGate gate;
  Simulate(gate, 1, 4, 6, 5, 500);     // trees pay at batch 1
  Simulate(gate, 64, 1.1, 9, 5, 500);  // not at 64
  EXPECT_GT(gate.Rate(kDraftModel, 1, true), gate.Rate(kDraftModel, 1, false));
  EXPECT_LT(gate.Rate(kDraftModel, 64, true), gate.Rate(kDraftModel, 64, false));
  EXPECT_EQ(gate.Rate(DrafterKind::kNgram, 1, true), 0);
  EXPECT_NE(gate.Describe(kDraftModel, 64).find("draft_model load<=64"), std::string::npos);
  EXPECT_EQ(gate.Describe(DrafterKind::kNgram, 64), "");
}

// Every request of a bucket runs the arm in use; steps a request decided before a switch do
// not count for the new arm.
TEST(SpeculationGateTest, StepsDecidedBeforeASwitchAreLeftOut) {
  SpeculationGate gate;
  const absl::Time before = Now();
  for (int i = 0; i < SpeculationGate::kMinSamples; ++i) Step(gate, 2, true, 2, 1.0);
  ASSERT_FALSE(gate.WantsTree(kDraftModel, 2)) << "the plain arm's turn";
  Step(gate, 2, true, 50, 1.0);  // a tree asked before the switch
  EXPECT_NEAR(gate.Rate(kDraftModel, 2, true), 2.0, 1e-9);
  // A plain step whose interval began before the switch (beside requests still waiting for
  // their trees) is left out too.
  clock_ms += 1;
  gate.Observe(kDraftModel, 2, false, 1, before, Now());
  EXPECT_EQ(gate.Rate(kDraftModel, 2, false), 0);
  Step(gate, 2, false, 1, 0.5);
  EXPECT_NEAR(gate.Rate(kDraftModel, 2, false), 2.0, 1e-9);
  EXPECT_FALSE(gate.WantsTree(kDraftModel, 2));
}

// A load seen for the first time starts from the nearest measured one: no tree epoch where the
// neighbouring load found plain steps better.
TEST(SpeculationGateTest, ANewLoadStartsFromTheNearestMeasuredOne) {
  SpeculationGate gate;
  Simulate(gate, 4, 3, 1.2, 0.2, 200);  // plain wins at load 3-4
  EXPECT_FALSE(gate.WantsTree(kDraftModel, 8));
  EXPECT_FALSE(gate.WantsTree(kDraftModel, 2));
  EXPECT_TRUE(gate.WantsTree(DrafterKind::kNgram, 8)) << "another kind starts with trees";
  const Outcome o = Simulate(gate, 8, 3, 1.2, 0.2, 200);
  EXPECT_EQ(o.tree_time_share, 0);
}

TEST(SpeculationGateTest, IgnoresEmptyObservations) {
  SpeculationGate gate;
  Step(gate, 1, true, 3, 0);
  Step(gate, 1, true, 0, 1);
  EXPECT_EQ(gate.Rate(kDraftModel, 1, true), 0);
}

}  // namespace
}  // namespace treespec
