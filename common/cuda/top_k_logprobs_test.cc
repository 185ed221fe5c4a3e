// LaunchTopKLogProbs against the CPU reference (LogSoftmax + TopKLogProbs, common/model/top_k.h)
// on fresh random rows: plain, bf16-rounded and integer logits (ties at every rank, broken by
// the lower id), masked (-inf) ids, vocabularies that are not multiples of the block, k from 1
// to above the vocabulary's finite entries, and many rows per launch. Outputs are poisoned and
// carry a guard tail that must survive. The list must be ranked (log-prob descending, lower id
// first on ties) with log-probs to a few float ulps of the CPU's; a token may differ from the
// CPU's at its rank only where the CPU's log-probs of both tie within that tolerance (the device
// sums exp in another order, so its log-sum-exp may sit an ulp away, which moves the rounding
// of x - lse); such swaps are counted and must stay rare. Skips without a GPU, except the
// launch-validation test.
#include "common/cuda/top_k_logprobs.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/model/top_k.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding

enum class Shape { kNormal, kBf16, kIntegers, kMasked };

std::vector<float> RandomRow(std::mt19937_64& rng, int vocab, Shape shape) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(vocab);
  for (float& v : x) v = normal(rng);
  switch (shape) {
    case Shape::kNormal:
      break;
    case Shape::kBf16:
      for (float& v : x) v = Bf16BitsToFloat(FloatToBf16Bits(v));
      break;
    case Shape::kIntegers:
      for (float& v : x) v = std::round(v);
      break;
    case Shape::kMasked: {  // most ids masked: fewer finite entries than some k below
      std::bernoulli_distribution masked(0.9);
      for (float& v : x) {
        if (masked(rng)) v = -std::numeric_limits<float>::infinity();
      }
      x[0] = 1.0f;  // at least one finite entry
      break;
    }
  }
  return x;
}

class TopKLogProbsTest : public CudaTest {
 protected:
  void TearDown() override {
    if (checked_ > 0) {
      std::cerr << checked_ << " ranked entries, " << swapped_
                << " swapped with an equal CPU log-prob\n";
      EXPECT_LE(swapped_, checked_ / 200 + 2) << "swaps must be rare (ulp-level ties only)";
    }
    CudaTest::TearDown();
  }
  int64_t checked_ = 0, swapped_ = 0;

  // Runs `rows` rows of `vocab` logits with `k` and checks every row against the CPU.
  void Check(const std::vector<float>& logits, int rows, int vocab, int k) {
    ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_logits, Upload(logits));
    const size_t n = static_cast<size_t>(rows) * k;
    ASSERT_OK_AND_ASSIGN(DeviceBuffer<int32_t> d_tokens,
                         Upload(std::vector<int32_t>(n, 0x5A5A5A5A)));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_logprobs, Upload(std::vector<float>(n, 7.0f)));
    ASSERT_CUDA(LaunchTopKLogProbs(d_logits.data(), rows, vocab, k, d_tokens.data(),
                                   d_logprobs.data(), stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<int32_t> tokens(d_tokens.size());
    std::vector<float> logprobs(d_logprobs.size());
    ASSERT_TRUE(d_tokens.CopyToHost(absl::MakeSpan(tokens)).ok());
    ASSERT_TRUE(d_logprobs.CopyToHost(absl::MakeSpan(logprobs)).ok());
    for (size_t i = n; i < tokens.size(); ++i) {
      uint32_t t, l;
      std::memcpy(&t, &tokens[i], 4);
      std::memcpy(&l, &logprobs[i], 4);
      ASSERT_EQ(t, 0xFFFFFFFFu) << "token write past the end at " << i - n;
      ASSERT_EQ(l, 0xFFFFFFFFu) << "log-prob write past the end at " << i - n;
    }
    std::vector<float> lp(vocab);
    for (int r = 0; r < rows; ++r) {
      const absl::Span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
      LogSoftmax(row, absl::MakeSpan(lp));
      const std::vector<TokenLogProb> want = TopKLogProbs(lp, k);
      const float lse = row[want[0].token] - want[0].logprob;
      // lse = max + log(sum): the sums differ in order only, so lse to a few float ulps.
      const float tol = 8 * std::numeric_limits<float>::epsilon() * (1.0f + std::fabs(lse));
      for (int j = 0; j < k; ++j) {
        const int32_t got_token = tokens[static_cast<size_t>(r) * k + j];
        const float got_lp = logprobs[static_cast<size_t>(r) * k + j];
        if (j >= static_cast<int>(want.size())) {  // past the finite entries
          ASSERT_FALSE(std::isfinite(got_lp)) << "row " << r << " rank " << j;
          continue;
        }
        ASSERT_EQ(got_token, want[j].token)
            << "row " << r << " rank " << j << " vocab " << vocab << " k " << k;
        ASSERT_NEAR(got_lp, want[j].logprob, tol) << "row " << r << " rank " << j;
      }
    }
  }
};

TEST_F(TopKLogProbsTest, MatchesTheCpuReference) {
  for (int vocab : {1, 7, 255, 4096, 32001, 151936}) {
    for (Shape shape : {Shape::kNormal, Shape::kBf16, Shape::kIntegers, Shape::kMasked}) {
      for (int k : {1, 3, 16, 17, 255, 1024}) {
        if (k > vocab) continue;
        const int rows = vocab > 40000 ? 3 : 5;
        std::vector<float> logits;
        for (int r = 0; r < rows; ++r) {
          const std::vector<float> row = RandomRow(rng_, vocab, shape);
          logits.insert(logits.end(), row.begin(), row.end());
        }
        SCOPED_TRACE(::testing::Message()
                     << "vocab " << vocab << " shape " << static_cast<int>(shape) << " k " << k);
        Check(logits, rows, vocab, k);
      }
    }
  }
}

TEST_F(TopKLogProbsTest, ARowDoesNotDependOnTheOtherRows) {
  const int vocab = 4096, k = 16, rows = 40;
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> row = RandomRow(rng_, vocab, Shape::kBf16);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_logits, Upload(logits));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer<int32_t> all_t, DeviceBuffer<int32_t>::Create(rows * k));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> all_l, DeviceBuffer<float>::Create(rows * k));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer<int32_t> one_t, DeviceBuffer<int32_t>::Create(k));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> one_l, DeviceBuffer<float>::Create(k));
  ASSERT_CUDA(
      LaunchTopKLogProbs(d_logits.data(), rows, vocab, k, all_t.data(), all_l.data(), stream_));
  std::vector<int32_t> t_all(rows * k), t_one(k);
  std::vector<float> l_all(rows * k), l_one(k);
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  ASSERT_TRUE(all_t.CopyToHost(absl::MakeSpan(t_all)).ok());
  ASSERT_TRUE(all_l.CopyToHost(absl::MakeSpan(l_all)).ok());
  for (int r : {0, 17, rows - 1}) {
    ASSERT_CUDA(LaunchTopKLogProbs(d_logits.data() + static_cast<size_t>(r) * vocab, 1, vocab, k,
                                   one_t.data(), one_l.data(), stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    ASSERT_TRUE(one_t.CopyToHost(absl::MakeSpan(t_one)).ok());
    ASSERT_TRUE(one_l.CopyToHost(absl::MakeSpan(l_one)).ok());
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(t_one[j], t_all[r * k + j]);
      EXPECT_EQ(l_one[j], l_all[r * k + j]);  // bit for bit
    }
  }
}

// Runs everywhere: bad shapes are refused before anything touches the device.
TEST(TopKLogProbsLaunch, RefusesBadShapes) {
  int32_t* tokens = reinterpret_cast<int32_t*>(16);
  float* lp = reinterpret_cast<float*>(16);
  const float* logits = reinterpret_cast<const float*>(16);
  EXPECT_EQ(LaunchTopKLogProbs(logits, -1, 10, 1, tokens, lp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(logits, 1, 0, 1, tokens, lp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(logits, 1, 10, 0, tokens, lp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(logits, 1, 10, 11, tokens, lp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(logits, 1, 5000, kMaxTopKLogProbs + 1, tokens, lp, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(nullptr, 1, 10, 1, tokens, lp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTopKLogProbs(nullptr, 0, 10, 1, nullptr, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace treespec::gpu
