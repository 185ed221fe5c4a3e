#include "common/util/backoff.h"

#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(BackoffTest, DelaysGrowByTheMultiplierUpToTheCapWithinTheJitter) {
  const BackoffOptions options{.initial = absl::Milliseconds(100),
                               .max = absl::Seconds(2),
                               .multiplier = 2.0,
                               .jitter = 0.2};
  ASSERT_TRUE(ValidateBackoffOptions(options).ok());
  Backoff backoff(options, 7);
  // Unjittered: 100, 200, 400, 800, 1600, then 2000 ms for ever.
  const double base_ms[] = {100, 200, 400, 800, 1600, 2000, 2000, 2000};
  for (double base : base_ms) {
    const double ms = absl::ToDoubleMilliseconds(backoff.NextDelay());
    EXPECT_GE(ms, 0.8 * base);
    EXPECT_LE(ms, 1.2 * base);
  }
  backoff.Reset();
  const double ms = absl::ToDoubleMilliseconds(backoff.NextDelay());
  EXPECT_GE(ms, 80);
  EXPECT_LE(ms, 120);
}

TEST(BackoffTest, JitterSpreadsClientsThatFailedTogether) {
  const BackoffOptions options;
  Backoff a(options, 1), b(options, 2);
  int differ = 0;
  for (int i = 0; i < 8; ++i) differ += a.NextDelay() != b.NextDelay();
  EXPECT_GT(differ, 0);
  Backoff none({.initial = absl::Milliseconds(10), .jitter = 0.0}, 3);
  EXPECT_EQ(none.NextDelay(), absl::Milliseconds(10));
  EXPECT_EQ(none.NextDelay(), absl::Milliseconds(20));
}

TEST(BackoffTest, BadOptionsNameTheField) {
  EXPECT_FALSE(ValidateBackoffOptions({.initial = absl::ZeroDuration()}).ok());
  EXPECT_FALSE(ValidateBackoffOptions({.initial = absl::Seconds(2), .max = absl::Seconds(1)}).ok());
  EXPECT_FALSE(ValidateBackoffOptions({.multiplier = 0.5}).ok());
  EXPECT_FALSE(ValidateBackoffOptions({.jitter = 1.0}).ok());
}

}  // namespace
}  // namespace treespec
