// Arrival schedules: each process's mean gap and coefficient of variation against theory on
// 200k seeded samples, repeatability by seed, all-at-once for an infinite rate, and the
// refusals.
#include "tools/loadgen/arrivals.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

struct GapStats {
  double mean = 0, cv = 0;
};

GapStats Gaps(const std::vector<double>& times) {
  std::vector<double> gaps;
  double prev = 0;
  for (double t : times) {
    EXPECT_GE(t, prev) << "times must not decrease";
    gaps.push_back(t - prev);
    prev = t;
  }
  double sum = 0, sq = 0;
  for (double g : gaps) sum += g;
  const double mean = sum / gaps.size();
  for (double g : gaps) sq += (g - mean) * (g - mean);
  return {mean, std::sqrt(sq / gaps.size()) / mean};
}

TEST(ArrivalsTest, MeanGapAndBurstinessMatchTheory) {
  constexpr int kCount = 200000;
  constexpr double kRate = 50;  // mean gap 20 ms
  struct Case {
    ArrivalProcess process;
    double burstiness, cv;  // expected coefficient of variation
  };
  for (const Case c :
       {Case{ArrivalProcess::kPoisson, 1.0, 1.0}, Case{ArrivalProcess::kGamma, 0.25, 2.0},
        Case{ArrivalProcess::kGamma, 4.0, 0.5}, Case{ArrivalProcess::kConstant, 1.0, 0.0}}) {
    SCOPED_TRACE(::testing::Message()
                 << "process " << static_cast<int>(c.process) << " burstiness " << c.burstiness);
    auto times = ArrivalTimes({c.process, kRate, c.burstiness, 7}, kCount);
    ASSERT_TRUE(times.ok()) << times.status();
    ASSERT_EQ(times->size(), static_cast<size_t>(kCount));
    const GapStats s = Gaps(*times);
    // Standard errors at 200k samples are ~0.5 % of the mean and ~1 % of the CV; 3 % bounds.
    EXPECT_NEAR(s.mean, 1.0 / kRate, 0.03 / kRate);
    EXPECT_NEAR(s.cv, c.cv, 0.03 * std::max(c.cv, 1.0));
  }
}

TEST(ArrivalsTest, SeededAndInfiniteRate) {
  const ArrivalOptions options{ArrivalProcess::kGamma, 10, 0.5, 42};
  EXPECT_EQ(*ArrivalTimes(options, 100), *ArrivalTimes(options, 100));
  ArrivalOptions other = options;
  other.seed = 43;
  EXPECT_NE(*ArrivalTimes(options, 100), *ArrivalTimes(other, 100));
  const auto all_at_once = ArrivalTimes({}, 5);  // rate infinity by default
  ASSERT_TRUE(all_at_once.ok());
  EXPECT_EQ(*all_at_once, std::vector<double>(5, 0.0));
  EXPECT_TRUE(ArrivalTimes({}, 0)->empty());
}

TEST(ArrivalsTest, BadOptionsAreInvalidArgument) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ArrivalTimes({ArrivalProcess::kPoisson, 0}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrivalTimes({ArrivalProcess::kPoisson, -3}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrivalTimes({ArrivalProcess::kPoisson, nan}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrivalTimes({ArrivalProcess::kGamma, 1, 0}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArrivalTimes({}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseArrivalProcess("gamma"), ArrivalProcess::kGamma);
  const auto bad = ParseArrivalProcess("weibull");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("poisson, gamma or constant"), std::string::npos);
}

}  // namespace
}  // namespace treespec::loadgen
