#include "common/model/sampling.h"

#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

// Philox-4x32-10 known answer (Random123 kat_vectors): counter 0, key 0 ->
// 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
TEST(UniformAtTest, PhiloxKnownAnswer) {
  const uint64_t bits = (uint64_t{0x6627e8d5} << 21) ^ (uint64_t{0xe169c58d} >> 11);
  EXPECT_EQ(UniformAt(0, 0), static_cast<double>(bits) * 0x1.0p-53);
}

TEST(UniformAtTest, DeterministicInRangeAndUniform) {
  EXPECT_EQ(UniformAt(42, 7), UniformAt(42, 7));
  EXPECT_NE(UniformAt(42, 7), UniformAt(42, 8));
  EXPECT_NE(UniformAt(42, 7), UniformAt(43, 7));
  EXPECT_NE(UniformAt(1, 0), UniformAt(uint64_t{1} << 32 | 1, 0));  // both key words count
  // 16 equal bins over 160000 draws keyed by position: chi-square with 15 degrees of freedom;
  // 50 is far beyond its 1e-5 quantile (≈ 44).
  const int n = 160000, bins = 16;
  std::vector<int> count(bins, 0);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const double u = UniformAt(12345, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++count[static_cast<int>(u * bins)];
    sum += u;
  }
  double chi2 = 0;
  for (int c : count) chi2 += (c - n / bins) * (c - n / bins) / static_cast<double>(n / bins);
  EXPECT_LT(chi2, 50.0);
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
}

TEST(ChooseTokenTest, GreedyIsArgmaxWithLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  SamplingConfig greedy;
  EXPECT_EQ(ChooseToken(logits, greedy, 0), 1);
  greedy.seed = 99;  // the seed does not matter when greedy
  EXPECT_EQ(ChooseToken(logits, greedy, 1000), 1);
  EXPECT_EQ(ChooseToken(std::vector<float>{3.0f}, greedy, 0), 0);
  EXPECT_EQ(ChooseToken(std::vector<float>{-INFINITY, -5.0f}, greedy, 0), 1);
}

TEST(ChooseTokenTest, TopKOneEqualsGreedy) {
  const std::vector<float> logits = {0.1f, 3.0f, 3.0f, -2.0f, 2.99f, 0.0f};
  SamplingConfig c;
  c.temperature = 1.5f;
  c.top_k = 1;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    c.seed = seed;
    EXPECT_EQ(ChooseToken(logits, c, seed * 7), 1);
  }
}

TEST(ChooseTokenTest, SeededDrawsAreDeterministic) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.7f) * 2;
  SamplingConfig c;
  c.temperature = 0.9f;
  c.top_p = 0.95f;
  c.top_k = 20;
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    c.seed = seed;
    const int32_t a = ChooseToken(logits, c, 17);
    EXPECT_EQ(a, ChooseToken(logits, c, 17));
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 3u);  // it does sample
}

// Draws `n` tokens with seeds 0..n-1 at one position and returns the counts.
std::vector<int> Histogram(const std::vector<float>& logits, SamplingConfig c, int n) {
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    c.seed = 1000003ull * i;
    ++count[ChooseToken(logits, c, 5)];
  }
  return count;
}

// Pearson chi-square of counts against probabilities (zero-probability tokens must have zero
// counts; they add nothing).
double ChiSquare(const std::vector<int>& count, const std::vector<double>& p, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = n * p[i];
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  return chi2;
}

std::vector<double> Softmax(const std::vector<float>& logits, double t) {
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) sum += std::exp(l / t);
  for (float l : logits) p.push_back(std::exp(l / t) / sum);
  return p;
}

// 40000 draws over at most 8 tokens: the chi-square statistic (≤ 7 degrees of freedom) stays
// below 40 except with probability < 1e-6.
TEST(ChooseTokenTest, EmpiricalDistributionMatchesTemperatureSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
  SamplingConfig c;
  c.temperature = 0.8f;
  const int n = 40000;
  EXPECT_LT(ChiSquare(Histogram(logits, c, n), Softmax(logits, 0.8), n), 40.0);
}

TEST(ChooseTokenTest, TopKRestrictsToTheKLargest) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
  SamplingConfig c;
  c.temperature = 1.0f;
  c.top_k = 3;  // ids 3, 5, 0
  std::vector<double> p(8, 0.0);
  const double z = std::exp(2.0) + std::exp(1.5) + std::exp(1.0);
  p[3] = std::exp(2.0) / z;
  p[5] = std::exp(1.5) / z;
  p[0] = std::exp(1.0) / z;
  const int n = 40000;
  EXPECT_LT(ChiSquare(Histogram(logits, c, n), p, n), 40.0);
}

TEST(ChooseTokenTest, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (shuffled ids).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  SamplingConfig c;
  c.temperature = 1.0f;
  c.top_p = 0.75f;  // 0.5 < 0.75, 0.5 + 0.3 >= 0.75: keep ids 1 and 3
  const int n = 40000;
  EXPECT_LT(ChiSquare(Histogram(logits, c, n), {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8}, n), 40.0);
  c.top_p = 0.9f;  // 0.8 < 0.9: add id 0
  EXPECT_LT(ChiSquare(Histogram(logits, c, n), {0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95}, n),
            40.0);
  c.top_p = 0.01f;  // keeps at least the top token
  EXPECT_LT(ChiSquare(Histogram(logits, c, n), {0.0, 1.0, 0.0, 0.0}, n), 1e-9);
}

}  // namespace
}  // namespace treespec
