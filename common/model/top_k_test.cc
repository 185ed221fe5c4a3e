#include "common/model/top_k.h"

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

std::vector<float> RandomRow(std::mt19937& rng, int vocab, float levels) {
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> row(vocab);
  // levels > 0 rounds to a coarse grid, so many entries tie.
  for (float& x : row) x = levels > 0 ? std::round(n(rng) * levels) / levels : n(rng);
  return row;
}

// The reference of the reference: sort every finite entry, take the first k.
std::vector<TokenLogProb> SortAll(const std::vector<float>& row, int k) {
  std::vector<TokenLogProb> all;
  for (size_t i = 0; i < row.size(); ++i) {
    if (std::isfinite(row[i])) all.push_back({static_cast<int32_t>(i), row[i]});
  }
  std::stable_sort(all.begin(), all.end(), [](const TokenLogProb& a, const TokenLogProb& b) {
    return a.logprob > b.logprob;
  });
  if (static_cast<int>(all.size()) > k) all.resize(k);
  return all;
}

TEST(TopKLogProbs, EqualsAFullSortWithTiesByLowerId) {
  std::mt19937 rng(7);
  for (int vocab : {1, 5, 100, 4096}) {
    for (float levels : {0.0f, 2.0f}) {
      std::vector<float> row = RandomRow(rng, vocab, levels);
      if (vocab > 4) {
        row[3] = -std::numeric_limits<float>::infinity();
        row[4] = std::numeric_limits<float>::quiet_NaN();
      }
      for (int k : {1, 3, 16, 32, 33, 200, 5000}) {
        const std::vector<TokenLogProb> got = TopKLogProbs(row, k);
        const std::vector<TokenLogProb> want = SortAll(row, k);
        ASSERT_EQ(got.size(), want.size()) << "vocab " << vocab << " k " << k;
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].token, want[i].token) << "vocab " << vocab << " k " << k << " @" << i;
          EXPECT_EQ(got[i].logprob, want[i].logprob);
        }
      }
    }
  }
  EXPECT_TRUE(TopKLogProbs(std::vector<float>{1, 2}, 0).empty());
}

TEST(LogSoftmax, NormalisesAndKeepsDifferences) {
  std::mt19937 rng(3);
  const std::vector<float> row = RandomRow(rng, 1000, 0.0f);
  std::vector<float> out(row.size());
  LogSoftmax(row, absl::MakeSpan(out));
  double mass = 0;
  for (float lp : out) mass += std::exp(static_cast<double>(lp));
  EXPECT_NEAR(mass, 1.0, 1e-5);
  EXPECT_NEAR(out[1] - out[0], row[1] - row[0], 1e-5);
}

// The default ForwardTopK (the host path every backend is checked against) ranks exactly the
// rows Forward returns: every new row, or the last new row of each entry.
TEST(ForwardTopK, RanksTheForwardRowsThatWereAskedFor) {
  const ModelConfig config = testing::SmallLlamaConfig();
  absl::StatusOr<std::unique_ptr<CausalLm>> lm =
      CreateCpuCausalLm(config, testing::RandomWeights(config, 11), LmOptions{});
  ASSERT_TRUE(lm.ok()) << lm.status();
  std::vector<SeqTree> batch(2);
  for (int b = 0; b < 2; ++b) {
    batch[b].seq = (*lm)->CreateSequence();
    batch[b].tokens = {5, 9, 17, 3 + b, 40};
    batch[b].parents = {-1, 0, 0, 1, 3};
  }
  batch[1].first_new = 2;  // its first two nodes come from an earlier forward
  // Put batch 1's first nodes in the cache, as the earlier forward would have.
  SeqTree first = batch[1];
  first.tokens.resize(2);
  first.parents.resize(2);
  first.first_new = 0;
  ASSERT_TRUE((*lm)->Forward(absl::MakeConstSpan(&first, 1)).ok());

  absl::StatusOr<std::vector<float>> logits = (*lm)->Forward(batch);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const int vocab = config.vocab_size;
  ASSERT_EQ(logits->size(), static_cast<size_t>(8 * vocab));  // 5 + 3 new rows
  auto want = [&](int row, int k) {
    std::vector<float> lp(vocab);
    LogSoftmax(absl::MakeConstSpan(logits->data() + row * vocab, vocab), absl::MakeSpan(lp));
    return TopKLogProbs(lp, k);
  };
  auto same = [](const std::vector<TokenLogProb>& a, const std::vector<TokenLogProb>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].token != b[i].token || a[i].logprob != b[i].logprob) return false;
    }
    return true;
  };

  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> all =
      (*lm)->ForwardTopK(batch, 7, TopKRows::kAllNew);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_TRUE(same((*all)[r], want(r, 7))) << "row " << r;

  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> last =
      (*lm)->ForwardTopK(batch, 1000, TopKRows::kLastNew);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->size(), 2u);
  EXPECT_EQ((*last)[0].size(), static_cast<size_t>(vocab));  // k above the vocabulary: all
  EXPECT_TRUE(same((*last)[0], want(4, 1000)));
  EXPECT_TRUE(same((*last)[1], want(7, 1000)));

  EXPECT_EQ((*lm)->ForwardTopK(batch, 0, TopKRows::kAllNew).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace treespec
