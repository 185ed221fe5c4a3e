// Cancel plans: none at fraction 0, all at 1, the share and the split between the two kinds
// within binomial bounds, every point inside its range, the same plan from the same seed, and
// one-token requests cancelled before their token.
#include "tools/loadgen/cancel_plan.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

struct Tally {
  int by_tokens = 0, by_time = 0;
};

Tally Count(const std::vector<CancelPoint>& plan) {
  Tally t;
  for (const CancelPoint& p : plan) {
    EXPECT_FALSE(p.after_tokens > 0 && p.after_ms >= 0) << "one kind per request";
    t.by_tokens += p.after_tokens > 0 ? 1 : 0;
    t.by_time += p.after_ms >= 0 ? 1 : 0;
  }
  return t;
}

TEST(CancelPlanTest, FractionZeroCancelsNothingAndOneCancelsAll) {
  const std::vector<int> lens(500, 64);
  for (const CancelPoint& p : PlanCancels({.fraction = 0, .seed = 1}, lens)) {
    EXPECT_FALSE(p.planned());
  }
  for (const CancelPoint& p : PlanCancels({.fraction = 1, .seed = 1}, lens)) {
    EXPECT_TRUE(p.planned());
  }
}

TEST(CancelPlanTest, ShareAndKindsWithinBinomialBounds) {
  constexpr int kN = 20000;
  constexpr double kFraction = 0.1;
  const std::vector<int> lens(kN, 64);
  const Tally t = Count(PlanCancels({.fraction = kFraction, .seed = 7}, lens));
  // Five standard deviations of a binomial count: a fair generator fails this about once in
  // two million runs.
  auto within = [](int count, int n, double p) {
    return std::abs(count - n * p) <= 5 * std::sqrt(n * p * (1 - p));
  };
  const int cancelled = t.by_tokens + t.by_time;
  EXPECT_TRUE(within(cancelled, kN, kFraction)) << cancelled;
  EXPECT_TRUE(within(t.by_time, cancelled, 0.5)) << t.by_time << " of " << cancelled;
}

TEST(CancelPlanTest, PointsStayInsideTheirRanges) {
  const std::vector<int> lens = {2, 3, 64, 64, 200, 2, 17, 64};
  std::vector<int> many;
  for (int k = 0; k < 500; ++k) many.insert(many.end(), lens.begin(), lens.end());
  const std::vector<CancelPoint> plan =
      PlanCancels({.fraction = 1, .max_delay_ms = 40, .seed = 3}, many);
  bool saw_last = false, saw_first = false;
  for (size_t i = 0; i < plan.size(); ++i) {
    const CancelPoint& p = plan[i];
    if (p.after_tokens > 0) {
      // Still running when it comes due: at least one token has arrived, one is still to come.
      EXPECT_LT(p.after_tokens, many[i]) << i;
      saw_first |= p.after_tokens == 1;
      saw_last |= p.after_tokens == many[i] - 1;
    } else {
      EXPECT_GE(p.after_ms, 0) << i;
      EXPECT_LE(p.after_ms, 40) << i;
    }
  }
  EXPECT_TRUE(saw_first);
  EXPECT_TRUE(saw_last);
}

TEST(CancelPlanTest, OneTokenRequestsAreCancelledBeforeTheirToken) {
  const std::vector<int> lens(200, 1);
  const Tally t = Count(PlanCancels({.fraction = 1, .seed = 5}, lens));
  EXPECT_EQ(t.by_tokens, 0);
  EXPECT_EQ(t.by_time, 200);
}

TEST(CancelPlanTest, TheSeedFixesThePlan) {
  const std::vector<int> lens(300, 32);
  auto same = [](const std::vector<CancelPoint>& a, const std::vector<CancelPoint>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].after_tokens != b[i].after_tokens || a[i].after_ms != b[i].after_ms) return false;
    }
    return a.size() == b.size();
  };
  const CancelOptions options = {.fraction = 0.3, .seed = 11};
  EXPECT_TRUE(same(PlanCancels(options, lens), PlanCancels(options, lens)));
  EXPECT_FALSE(same(PlanCancels(options, lens), PlanCancels({.fraction = 0.3, .seed = 12}, lens)));
  // A larger share keeps every request the smaller one cancelled, at the same point.
  const std::vector<CancelPoint> small = PlanCancels(options, lens);
  const std::vector<CancelPoint> large = PlanCancels({.fraction = 0.6, .seed = 11}, lens);
  for (size_t i = 0; i < lens.size(); ++i) {
    if (!small[i].planned()) continue;
    EXPECT_EQ(small[i].after_tokens, large[i].after_tokens) << i;
    EXPECT_EQ(small[i].after_ms, large[i].after_ms) << i;
  }
}

}  // namespace
}  // namespace treespec::loadgen
