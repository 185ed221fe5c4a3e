// Logits -> choice -> walk on the GPU (DESIGN §3 steps 3-4) against the CPU references
// ChooseToken / UniformAt (common/model/sampling.h) and WalkTree (common/tree/token_tree.h).
// Outputs are poisoned before every launch and carry a poisoned guard tail (cuda_test_util.h)
// that must survive. The GPU tests skip without a CUDA device; the launch-validation test runs
// everywhere (the launchers reject bad shapes before touching the device).
//
// What must match exactly: UniformAt (bit for bit), greedy tokens, the argmax partial + combine,
// and the tree walk. Sampled tokens may differ from the CPU only where the CPU's rounded double
// sums and the GPU's exact fixed-point sums fall on different sides of a CDF (or top-p)
// boundary, i.e. when the uniform lands within ~1e-13 (relative) of it: expected never in these
// runs (probability ~1e-12 per row). The test allows 1 mismatch per 2000 sampled rows, prints
// each mismatch with its distance to the nearest boundary, and reports the count.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/choose_token.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/tree_walk.h"
#include "common/model/sampling.h"
#include "common/tree/token_tree.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding

constexpr int32_t kPoisonInt = 0x5A5A5A5A;  // outputs before the launch (-1 is a valid output)

class ChooseTest : public CudaTest {
 protected:
  // All of `buffer` (payload and guard) after the stream's work.
  template <typename T>
  absl::StatusOr<std::vector<T>> DownloadAll(const DeviceBuffer<T>& buffer) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::vector<T> host(buffer.size());
    if (absl::Status s = buffer.CopyToHost(absl::MakeSpan(host)); !s.ok()) return s;
    return host;
  }
};

// The guard after `payload` elements still holds Upload's 0xFF bytes.
template <typename T>
void ExpectGuardBytes(const std::vector<T>& got, size_t payload) {
  ASSERT_EQ(got.size(), payload + kGuard);
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(got.data() + payload);
  for (size_t i = 0; i < kGuard * sizeof(T); ++i) {
    ASSERT_EQ(bytes[i], 0xFF) << "write past the end at element " << i / sizeof(T);
  }
}

SamplingConfig ToConfig(const RowSampling& r) {
  SamplingConfig c;
  c.temperature = r.temperature;
  c.top_p = r.top_p;
  c.top_k = r.top_k;
  c.seed = r.seed;
  return c;
}

float RoundToBf16(float v) { return Bf16BitsToFloat(FloatToBf16Bits(v)); }

// Logits of one row in one of several shapes; the ones with ties exercise the id tie-breaks.
enum class Shape { kNormal, kBf16, kIntegers, kPeaked, kSignedZeros, kAllEqual, kCount };

std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab, Shape shape) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(vocab);
  for (float& v : x) v = normal(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  switch (shape) {
    case Shape::kNormal:
      break;
    case Shape::kBf16:  // many exact ties, as logits from a bf16 LM head
      for (float& v : x) v = RoundToBf16(v);
      break;
    case Shape::kIntegers:  // ties everywhere, including at the top
      for (float& v : x) v = std::round(v);
      break;
    case Shape::kPeaked:  // some -inf (masked) ids, then an LLM-like peak and a runner-up
      if (vocab >= 16) {
        for (int i = 0; i < 3; ++i) x[id(rng)] = -INFINITY;
      }
      x[id(rng)] = 18.0f + normal(rng) / 8;
      x[id(rng)] = 16.0f + normal(rng) / 8;
      break;
    case Shape::kSignedZeros:  // the maxima are +0 and -0, which compare equal
      for (float& v : x) v = -std::fabs(v) - 0.5f;
      x[id(rng)] = -0.0f;
      x[id(rng)] = 0.0f;
      x[id(rng)] = -0.0f;
      break;
    case Shape::kAllEqual:
      std::fill(x.begin(), x.end(), 1.25f);
      break;
    case Shape::kCount:
      break;
  }
  return x;
}

// Copies the row maximum to a few more ids (first and last among them sometimes), so greedy
// must pick the lowest id among several equal maxima.
void PlantMaxTies(std::mt19937_64& rng, absl::Span<float> x) {
  const float top = *std::max_element(x.begin(), x.end());
  std::uniform_int_distribution<int> id(0, static_cast<int>(x.size()) - 1);
  for (int i = 0; i < 3; ++i) x[id(rng)] = top;
  if (rng() % 2 == 0) x[x.size() - 1] = top;
  if (rng() % 4 == 0) x[0] = top;
}

// For a sampled row, how close the CPU's decision was: the smallest distance, relative to the
// kept mass, between the inverse-CDF threshold and a cumulative boundary, or between the top-p
// target and a prefix mass. A copy of sampling.cc's steps, for diagnosing mismatches only.
double BoundaryMargin(absl::Span<const float> logits, const SamplingConfig& config,
                      int64_t position) {
  const int vocab = static_cast<int>(logits.size());
  const double inv_t = 1.0 / config.temperature;
  std::vector<int32_t> kept(vocab);
  std::iota(kept.begin(), kept.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::sort(kept.begin(), kept.end(), before);
  if (config.top_k > 0 && config.top_k < vocab) kept.resize(config.top_k);
  const double max_z = logits[kept[0]] * inv_t;
  std::vector<double> prob(vocab, 0.0);
  double total = 0.0;
  for (int32_t id : kept) total += prob[id] = std::exp(logits[id] * inv_t - max_z);
  double margin = std::numeric_limits<double>::infinity();
  if (config.top_p < 1.0f) {
    const double target = static_cast<double>(config.top_p) * total;
    double mass = 0.0;
    size_t keep = 0;
    while (keep < kept.size() && (keep == 0 || mass < target)) {
      mass += prob[kept[keep++]];
      margin = std::min(margin, std::fabs(mass - target) / total);
    }
    kept.resize(keep);
    total = 0.0;
    for (int32_t id : kept) total += prob[id];
  }
  std::sort(kept.begin(), kept.end());
  const double threshold = UniformAt(config.seed, position) * total;
  double cumulative = 0.0;
  for (int32_t id : kept) {
    cumulative += prob[id];
    margin = std::min(margin, std::fabs(cumulative - threshold) / total);
  }
  return margin;
}

// ---- Launch validation: runs without a GPU (nothing is launched for bad shapes).
TEST(ChooseLaunchTest, RejectsBadShapesWithoutLaunching) {
  float f = 0;
  int32_t i = 0;
  RowSampling r;
  uint64_t seed = 0;
  int64_t pos = 0;
  double u = 0;
  constexpr cudaStream_t kStream = nullptr;
  EXPECT_EQ(LaunchChooseToken(&f, -1, 10, &r, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(&f, 1, 0, &r, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(&f, 1, kMaxChooseVocab + 1, &r, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(nullptr, 1, 10, &r, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(&f, 1, 10, nullptr, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(&f, 1, 10, &r, nullptr, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchChooseToken(nullptr, 0, 10, nullptr, nullptr, kStream), cudaSuccess);

  EXPECT_EQ(LaunchArgmaxPartial(&f, -1, 10, 0, &f, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxPartial(&f, 1, 0, 0, &f, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxPartial(&f, 1, 10, -1, &f, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxPartial(&f, 1, 10, std::numeric_limits<int>::max() - 5, &f, &i, kStream),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxPartial(&f, 1, 10, 0, &f, nullptr, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxPartial(nullptr, 0, 10, 0, nullptr, nullptr, kStream), cudaSuccess);

  EXPECT_EQ(LaunchArgmaxCombine(&f, &i, 0, 1, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxCombine(&f, &i, 2, -1, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxCombine(nullptr, &i, 2, 1, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxCombine(nullptr, nullptr, 2, 0, nullptr, kStream), cudaSuccess);

  EXPECT_EQ(LaunchUniformAt(&seed, &pos, -1, &u, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchUniformAt(&seed, nullptr, 1, &u, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchUniformAt(nullptr, nullptr, 0, nullptr, kStream), cudaSuccess);

  EXPECT_EQ(LaunchTreeWalk(&i, &i, &i, &i, -1, 4, &i, &i, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTreeWalk(&i, &i, &i, &i, 1, 0, &i, &i, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTreeWalk(&i, &i, nullptr, &i, 1, 4, &i, &i, &i, kStream), cudaErrorInvalidValue);
  EXPECT_EQ(
      LaunchTreeWalk(nullptr, nullptr, nullptr, nullptr, 0, 4, nullptr, nullptr, nullptr, kStream),
      cudaSuccess);
}

// ---- UniformAt on the device equals the CPU's bit for bit (same Philox recipe, exact
// conversion to double).
TEST_F(ChooseTest, UniformAtBitExact) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  std::vector<uint64_t> seeds = {0, 1, 42, ~uint64_t{0}, uint64_t{1} << 32, 0xFFFFFFFFu};
  std::vector<int64_t> positions = {0,
                                    1,
                                    -1,
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min(),
                                    int64_t{1} << 32};
  // Every edge seed with every edge position, then random pairs (small and full-range).
  const size_t edges = seeds.size();
  for (size_t a = 0; a < edges; ++a) {
    for (size_t b = 0; b < edges; ++b) {
      seeds.push_back(seeds[a]);
      positions.push_back(positions[b]);
    }
  }
  std::uniform_int_distribution<int64_t> small_position(0, 1 << 20);
  for (int i = 0; i < 100000; ++i) {
    seeds.push_back(i % 2 == 0 ? rng_() : rng_() % 1000);
    positions.push_back(i % 3 == 0 ? static_cast<int64_t>(rng_()) : small_position(rng_));
  }
  const int n = static_cast<int>(seeds.size());
  ASSERT_OK_AND_ASSIGN(auto d_seeds, Upload(seeds));
  ASSERT_OK_AND_ASSIGN(auto d_positions, Upload(positions));
  ASSERT_OK_AND_ASSIGN(auto d_out, Upload(std::vector<double>(n, -1.0)));
  ASSERT_CUDA(LaunchUniformAt(d_seeds.data(), d_positions.data(), n, d_out.data(), stream_));
  ASSERT_OK_AND_ASSIGN(const std::vector<double> got, DownloadAll(d_out));
  ExpectGuardBytes(got, n);
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const double want = UniformAt(seeds[i], positions[i]);
    uint64_t got_bits, want_bits;
    std::memcpy(&got_bits, &got[i], sizeof(double));
    std::memcpy(&want_bits, &want, sizeof(double));
    if (got_bits != want_bits && ++mismatches <= 5) {
      ADD_FAILURE() << "UniformAt(" << seeds[i] << ", " << positions[i] << "): GPU " << got[i]
                    << " CPU " << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << n;
}

// ---- Greedy: LaunchChooseToken (temperature <= 0) and LaunchArgmaxPartial over the whole
// vocabulary both equal the CPU's argmax (lowest id on ties) exactly, on rows with planted ties.
TEST_F(ChooseTest, GreedyMatchesCpuArgmax) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  struct Case {
    int vocab, rows;
    bool misaligned;  // logits start one float past a 16-byte boundary: the scalar path
  };
  std::vector<Case> cases;
  for (int vocab : {4096, 32000, 128256 + 7}) {
    for (int rows : {1, 3, 17, 255}) cases.push_back({vocab, rows, false});
  }
  cases.push_back({4096, 17, true});
  cases.push_back({1, 3, false});
  cases.push_back({2, 17, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(
        absl::StrCat("vocab ", c.vocab, " rows ", c.rows, c.misaligned ? " misaligned" : ""));
    const size_t lead = c.misaligned ? 1 : 0;
    std::vector<float> logits(lead + static_cast<size_t>(c.rows) * c.vocab);
    std::vector<RowSampling> params(c.rows);
    std::vector<int32_t> want(c.rows);
    for (int r = 0; r < c.rows; ++r) {
      const absl::Span<float> x =
          absl::MakeSpan(logits).subspan(lead + static_cast<size_t>(r) * c.vocab, c.vocab);
      const Shape shape = static_cast<Shape>(r % static_cast<int>(Shape::kCount));
      const std::vector<float> row = RandomLogits(rng_, c.vocab, shape);
      std::copy(row.begin(), row.end(), x.begin());
      if (r % 3 != 2) PlantMaxTies(rng_, x);
      params[r].temperature = r % 2 == 0 ? 0.0f : -1.0f;  // both mean greedy
      params[r].seed = rng_();
      params[r].position = r;
      want[r] = ChooseToken(x, ToConfig(params[r]), params[r].position);
    }
    ASSERT_OK_AND_ASSIGN(auto d_logits, Upload(logits));
    ASSERT_OK_AND_ASSIGN(auto d_params, Upload(params));
    ASSERT_OK_AND_ASSIGN(auto d_tokens, Upload(std::vector<int32_t>(c.rows, kPoisonInt)));
    ASSERT_OK_AND_ASSIGN(auto d_idx, Upload(std::vector<int32_t>(c.rows, kPoisonInt)));
    ASSERT_OK_AND_ASSIGN(auto d_max, Upload(std::vector<float>(c.rows, 12345.0f)));
    const float* x = d_logits.data() + lead;
    ASSERT_CUDA(LaunchChooseToken(x, c.rows, c.vocab, d_params.data(), d_tokens.data(), stream_));
    ASSERT_CUDA(LaunchArgmaxPartial(x, c.rows, c.vocab, 0, d_max.data(), d_idx.data(), stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> tokens, DownloadAll(d_tokens));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> idx, DownloadAll(d_idx));
    ASSERT_OK_AND_ASSIGN(const std::vector<float> maxima, DownloadAll(d_max));
    ExpectGuardBytes(tokens, c.rows);
    ExpectGuardBytes(idx, c.rows);
    ExpectGuardBytes(maxima, c.rows);
    int mismatches = 0;
    for (int r = 0; r < c.rows; ++r) {
      const float top = logits[lead + static_cast<size_t>(r) * c.vocab + want[r]];
      if (tokens[r] != want[r] || idx[r] != want[r] || !(maxima[r] == top)) {
        if (++mismatches <= 5) {
          ADD_FAILURE() << "row " << r << ": CPU " << want[r] << " (" << top << "), ChooseToken "
                        << tokens[r] << ", ArgmaxPartial " << idx[r] << " (" << maxima[r] << ")";
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// ---- Sampling vs ChooseToken on many rows and settings (the file comment says why a rare
// mismatch is allowed); rows mix greedy and sampling, and the result is deterministic and
// independent of the batch (each row again alone).
TEST_F(ChooseTest, SamplingMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  struct Setting {
    float temperature, top_p;
    int top_k;  // kVocabPlus: vocab + 5; kVocab: vocab; kVocabMinus: vocab - 1
  };
  constexpr int kVocabPlus = -100, kVocab = -101, kVocabMinus = -102;
  const std::vector<Setting> settings = {
      {1.0f, 1.0f, 0},     {0.7f, 1.0f, 50},  {1.3f, 0.9f, 0},           {0.8f, 0.8f, 40},
      {1.0f, 1.0f, 1},     {1.0f, 1e-6f, 0},  {1.0f, 1.0f, kVocabPlus},  {1.0f, 0.95f, kVocab},
      {0.05f, 1.0f, 0},    {4.0f, 1.0f, 0},   {1.0f, 0.5f, 2},           {1.0f, 0.3f, 7},
      {2.0f, 0.99f, 1000}, {1.0f, 0.0f, 0},   {0.6f, 0.6f, kVocabMinus}, {0.0f, 0.9f, 20},
      {1.0f, 1.0f, 3},     {1.5f, 0.999f, 0}, {1e-3f, 0.7f, 0},          {0.9f, 0.25f, 100}};
  struct Case {
    int vocab, rows;
  };
  int sampled_rows = 0, sampled_mismatches = 0, greedy_mismatches = 0;
  for (const Case c : {Case{2, 255}, Case{3, 255}, Case{17, 255}, Case{4096, 2000},
                       Case{32000, 255}, Case{128256 + 7, 64}, Case{151936, 17}}) {
    SCOPED_TRACE(absl::StrCat("vocab ", c.vocab, " rows ", c.rows));
    std::vector<float> logits(static_cast<size_t>(c.rows) * c.vocab);
    std::vector<RowSampling> params(c.rows);
    std::vector<int32_t> want(c.rows);
    for (int r = 0; r < c.rows; ++r) {
      const absl::Span<float> x =
          absl::MakeSpan(logits).subspan(static_cast<size_t>(r) * c.vocab, c.vocab);
      const Shape shape = static_cast<Shape>((r / 3) % static_cast<int>(Shape::kCount));
      const std::vector<float> row = RandomLogits(rng_, c.vocab, shape);
      std::copy(row.begin(), row.end(), x.begin());
      const Setting s = settings[r % settings.size()];
      RowSampling& p = params[r];
      p.temperature = s.temperature;
      p.top_p = s.top_p;
      p.top_k = s.top_k == kVocabPlus    ? c.vocab + 5
                : s.top_k == kVocab      ? c.vocab
                : s.top_k == kVocabMinus ? c.vocab - 1
                                         : s.top_k;
      p.seed = rng_();
      p.position = static_cast<int64_t>(rng_() % (int64_t{1} << 40));
      want[r] = ChooseToken(x, ToConfig(p), p.position);
    }
    ASSERT_OK_AND_ASSIGN(auto d_logits, Upload(logits));
    ASSERT_OK_AND_ASSIGN(auto d_params, Upload(params));
    ASSERT_OK_AND_ASSIGN(auto d_tokens, Upload(std::vector<int32_t>(c.rows, kPoisonInt)));
    ASSERT_CUDA(LaunchChooseToken(d_logits.data(), c.rows, c.vocab, d_params.data(),
                                  d_tokens.data(), stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> tokens, DownloadAll(d_tokens));
    ExpectGuardBytes(tokens, c.rows);
    for (int r = 0; r < c.rows; ++r) {
      const RowSampling& p = params[r];
      const bool greedy = !(p.temperature > 0.0f);
      sampled_rows += greedy ? 0 : 1;
      if (tokens[r] == want[r]) continue;
      ASSERT_GE(tokens[r], 0) << "row " << r;
      ASSERT_LT(tokens[r], c.vocab) << "row " << r;
      if (greedy) {
        ++greedy_mismatches;
        ADD_FAILURE() << "greedy row " << r << ": CPU " << want[r] << " GPU " << tokens[r];
        continue;
      }
      ++sampled_mismatches;
      const absl::Span<const float> x =
          absl::MakeConstSpan(logits).subspan(static_cast<size_t>(r) * c.vocab, c.vocab);
      std::cerr << "sampling mismatch: vocab " << c.vocab << " row " << r << " T " << p.temperature
                << " top_p " << p.top_p << " top_k " << p.top_k << ": CPU " << want[r] << " GPU "
                << tokens[r] << "; nearest CDF/top-p boundary at "
                << BoundaryMargin(x, ToConfig(p), p.position) << " of the kept mass\n";
    }

    // Deterministic, and a row's token does not depend on its batch: again as one batch, then
    // the first rows one launch each (their tokens after the batch's).
    const int singles = std::min(c.rows, 20);
    ASSERT_OK_AND_ASSIGN(auto d_again, Upload(std::vector<int32_t>(c.rows + singles, kPoisonInt)));
    ASSERT_CUDA(LaunchChooseToken(d_logits.data(), c.rows, c.vocab, d_params.data(), d_again.data(),
                                  stream_));
    for (int r = 0; r < singles; ++r) {
      ASSERT_CUDA(LaunchChooseToken(d_logits.data() + static_cast<size_t>(r) * c.vocab, 1, c.vocab,
                                    d_params.data() + r, d_again.data() + c.rows + r, stream_));
    }
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> again, DownloadAll(d_again));
    ExpectGuardBytes(again, c.rows + singles);
    for (int r = 0; r < c.rows; ++r) ASSERT_EQ(again[r], tokens[r]) << "rerun, row " << r;
    for (int r = 0; r < singles; ++r) {
      ASSERT_EQ(again[c.rows + r], tokens[r]) << "row " << r << " alone";
    }
  }
  std::cerr << "sampling vs CPU ChooseToken: " << sampled_mismatches << " mismatches in "
            << sampled_rows << " sampled rows\n";
  EXPECT_EQ(greedy_mismatches, 0);
  EXPECT_LE(sampled_mismatches, sampled_rows / 2000) << "of " << sampled_rows << " sampled rows";
}

// ---- Vocab-parallel greedy: per-slice (max, id) on every rank, combined, equals the argmax
// over the whole vocabulary; ranks hold the slices in shuffled order, and the maxima are
// planted in several slices (the lowest id must win whichever rank holds it).
TEST_F(ChooseTest, ArgmaxPartialCombineEqualsFullArgmax) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  struct Case {
    int vocab, rows, ranks;
  };
  for (const Case c : {Case{32000, 3, 2}, Case{128256 + 7, 17, 2}, Case{32000, 17, 7},
                       Case{128256 + 7, 3, 7}, Case{4096, 255, 7}}) {
    SCOPED_TRACE(absl::StrCat("vocab ", c.vocab, " rows ", c.rows, " ranks ", c.ranks));
    // Uneven slice boundaries: random cuts, one slice of a single id when there are 7.
    std::vector<int> cuts = {0, c.vocab};
    std::uniform_int_distribution<int> cut(1, c.vocab - 1);
    if (c.ranks > 2) {
      const int single = std::uniform_int_distribution<int>(1, c.vocab - 2)(rng_);
      cuts.push_back(single);
      cuts.push_back(single + 1);
    }
    while (static_cast<int>(cuts.size()) < c.ranks + 1) {
      const int at = cut(rng_);
      if (std::find(cuts.begin(), cuts.end(), at) == cuts.end()) cuts.push_back(at);
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<int> slice_of_rank(c.ranks);
    std::iota(slice_of_rank.begin(), slice_of_rank.end(), 0);
    std::shuffle(slice_of_rank.begin(), slice_of_rank.end(), rng_);

    std::vector<float> logits(static_cast<size_t>(c.rows) * c.vocab);
    std::vector<int32_t> want(c.rows);
    for (int r = 0; r < c.rows; ++r) {
      const absl::Span<float> x =
          absl::MakeSpan(logits).subspan(static_cast<size_t>(r) * c.vocab, c.vocab);
      const Shape shape = static_cast<Shape>(r % static_cast<int>(Shape::kCount));
      const std::vector<float> row = RandomLogits(rng_, c.vocab, shape);
      std::copy(row.begin(), row.end(), x.begin());
      if (r % 2 == 0) {  // the maximum at both ends of random slices
        const float top = *std::max_element(x.begin(), x.end()) + (r % 4 == 0 ? 0.0f : 1.0f);
        for (int q = 0; q < 3; ++q) {
          const int s = static_cast<int>(rng_() % c.ranks);
          x[cuts[s + 1] - 1] = top;
          x[cuts[s]] = top;
        }
      }
      SamplingConfig greedy;
      want[r] = ChooseToken(x, greedy, 0);
    }

    ASSERT_OK_AND_ASSIGN(auto d_max, Upload(std::vector<float>(c.ranks * c.rows, 12345.0f)));
    ASSERT_OK_AND_ASSIGN(auto d_idx, Upload(std::vector<int32_t>(c.ranks * c.rows, kPoisonInt)));
    std::vector<DeviceBuffer<float>> rank_logits;  // alive until the stream is done
    for (int q = 0; q < c.ranks; ++q) {
      const int s = slice_of_rank[q], begin = cuts[s], width = cuts[s + 1] - cuts[s];
      std::vector<float> slice(static_cast<size_t>(c.rows) * width);
      for (int r = 0; r < c.rows; ++r) {
        std::copy_n(logits.begin() + static_cast<size_t>(r) * c.vocab + begin, width,
                    slice.begin() + static_cast<size_t>(r) * width);
      }
      ASSERT_OK_AND_ASSIGN(auto d_slice, Upload(slice));
      ASSERT_CUDA(LaunchArgmaxPartial(d_slice.data(), c.rows, width, begin,
                                      d_max.data() + q * c.rows, d_idx.data() + q * c.rows,
                                      stream_));
      rank_logits.push_back(std::move(d_slice));
    }
    ASSERT_OK_AND_ASSIGN(auto d_tokens, Upload(std::vector<int32_t>(c.rows, kPoisonInt)));
    ASSERT_CUDA(
        LaunchArgmaxCombine(d_max.data(), d_idx.data(), c.ranks, c.rows, d_tokens.data(), stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> tokens, DownloadAll(d_tokens));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> idx, DownloadAll(d_idx));
    ASSERT_OK_AND_ASSIGN(const std::vector<float> maxima, DownloadAll(d_max));
    ExpectGuardBytes(tokens, c.rows);
    ExpectGuardBytes(idx, static_cast<size_t>(c.ranks) * c.rows);
    ExpectGuardBytes(maxima, static_cast<size_t>(c.ranks) * c.rows);
    for (int r = 0; r < c.rows; ++r) {
      EXPECT_EQ(tokens[r], want[r]) << "row " << r;
      for (int q = 0; q < c.ranks; ++q) {  // each partial is its slice's argmax
        const int s = slice_of_rank[q];
        const float* row = logits.data() + static_cast<size_t>(r) * c.vocab;
        const int local =
            static_cast<int>(std::max_element(row + cuts[s], row + cuts[s + 1]) - (row + cuts[s]));
        EXPECT_EQ(idx[q * c.rows + r], cuts[s] + local) << "row " << r << " rank " << q;
        EXPECT_TRUE(maxima[q * c.rows + r] == row[cuts[s] + local]) << "row " << r << " rank " << q;
      }
    }
  }
}

// ---- Tree walk vs WalkTree.

struct Tree {
  std::vector<int32_t> tokens, parents, choice;  // [n]
};

enum class TreeKind { kBushy, kDeep, kChain, kFullChain, kGarbageParents };

// A random verify tree of n nodes (node 0 the bonus, parents before children). Tokens come from
// a tiny vocabulary when `duplicates`, so siblings often share a token. Choices are planted:
// mostly the token of some child (deep accepts), else random.
Tree RandomTree(std::mt19937_64& rng, int n, TreeKind kind, bool duplicates) {
  Tree t;
  t.tokens.resize(n);
  t.parents.resize(n);
  t.choice.resize(n);
  const int vocab = duplicates ? 3 : 50000;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::vector<int32_t>> children(n);
  for (int j = 0; j < n; ++j) {
    t.tokens[j] = token(rng);
    if (j == 0) {
      t.parents[j] = -1;
      continue;
    }
    switch (kind) {
      case TreeKind::kBushy:
        t.parents[j] = static_cast<int32_t>(rng() % j);
        break;
      case TreeKind::kDeep:  // mostly a recent node: long branches
        t.parents[j] = std::max(0, j - 1 - static_cast<int>(rng() % 3));
        break;
      case TreeKind::kChain:
      case TreeKind::kFullChain:
        t.parents[j] = j - 1;
        break;
      case TreeKind::kGarbageParents:  // out of range, self, forward: the walk must not care
        t.parents[j] = static_cast<int32_t>(rng() % (2 * n + 3)) - n - 1;
        break;
    }
    if (t.parents[j] >= 0 && t.parents[j] < j) children[t.parents[j]].push_back(j);
  }
  for (int i = 0; i < n; ++i) {
    const bool plant = kind == TreeKind::kFullChain || rng() % 100 < 85;
    if (plant && !children[i].empty()) {
      t.choice[i] = t.tokens[children[i][rng() % children[i].size()]];
    } else {
      t.choice[i] = token(rng);
    }
  }
  return t;
}

TEST_F(ChooseTest, TreeWalkMatchesWalkTree) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  int max_len_seen = 0;
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // Several sequences of different sizes and kinds in one launch, plus an empty one.
    std::vector<Tree> trees;
    const std::vector<int> sizes = {1, 3, 17, 64, 255, 256, 0, 2};
    for (size_t s = 0; s < sizes.size(); ++s) {
      const TreeKind kind = static_cast<TreeKind>((s + round) % 5);
      trees.push_back(RandomTree(rng_, sizes[s], kind, (s + round) % 2 == 0));
    }
    trees.push_back(RandomTree(rng_, 64, TreeKind::kFullChain, false));
    trees.push_back(RandomTree(rng_, 40, TreeKind::kDeep, true));
    std::shuffle(trees.begin(), trees.end(), rng_);
    const int batch = static_cast<int>(trees.size());

    std::vector<int32_t> offsets = {0}, tokens, parents, choice;
    std::vector<std::vector<int32_t>> want_path(batch);
    int deepest = 1;
    for (int b = 0; b < batch; ++b) {
      const Tree& t = trees[b];
      tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
      parents.insert(parents.end(), t.parents.begin(), t.parents.end());
      choice.insert(choice.end(), t.choice.begin(), t.choice.end());
      offsets.push_back(static_cast<int32_t>(tokens.size()));
      want_path[b] = WalkTree(t.tokens, t.parents, t.choice);
      max_len_seen = std::max(max_len_seen, static_cast<int>(want_path[b].size()));
      bool valid = true;  // NodeDepths needs parents in [-1, i)
      for (int j = 0; j < static_cast<int>(t.parents.size()); ++j) {
        valid = valid && (j == 0 ? t.parents[j] == -1 : t.parents[j] >= 0 && t.parents[j] < j);
      }
      if (valid && !t.parents.empty()) {
        const std::vector<int32_t> depth = NodeDepths(t.parents);
        deepest = std::max(deepest, *std::max_element(depth.begin(), depth.end()) + 1);
      }
    }
    ASSERT_OK_AND_ASSIGN(auto d_offsets, Upload(offsets));
    ASSERT_OK_AND_ASSIGN(auto d_tokens, Upload(tokens));
    ASSERT_OK_AND_ASSIGN(auto d_parents, Upload(parents));
    ASSERT_OK_AND_ASSIGN(auto d_choice, Upload(choice));

    // max_path = deepest path + 1 or more never clamps; 3 and 1 clamp most walks.
    for (const int max_path : {deepest, 300, 3, 1}) {
      SCOPED_TRACE(absl::StrCat("max_path ", max_path));
      const size_t out_count = static_cast<size_t>(batch) * max_path;
      ASSERT_OK_AND_ASSIGN(auto d_path, Upload(std::vector<int32_t>(out_count, kPoisonInt)));
      ASSERT_OK_AND_ASSIGN(auto d_emitted, Upload(std::vector<int32_t>(out_count, kPoisonInt)));
      ASSERT_OK_AND_ASSIGN(auto d_len, Upload(std::vector<int32_t>(batch, kPoisonInt)));
      ASSERT_CUDA(LaunchTreeWalk(d_offsets.data(), d_tokens.data(), d_parents.data(),
                                 d_choice.data(), batch, max_path, d_path.data(), d_len.data(),
                                 d_emitted.data(), stream_));
      ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> path, DownloadAll(d_path));
      ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> emitted, DownloadAll(d_emitted));
      ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> len, DownloadAll(d_len));
      ExpectGuardBytes(path, out_count);
      ExpectGuardBytes(emitted, out_count);
      ExpectGuardBytes(len, batch);
      for (int b = 0; b < batch; ++b) {
        const Tree& t = trees[b];
        SCOPED_TRACE(absl::StrCat("sequence ", b, " of ", t.tokens.size(), " nodes"));
        // The clamped walk is WalkTree's path cut to max_path nodes, its last node's choice
        // the bonus.
        std::vector<int32_t> want = want_path[b];
        if (static_cast<int>(want.size()) > max_path) want.resize(max_path);
        std::vector<int32_t> want_emitted;
        for (size_t j = 1; j < want.size(); ++j) want_emitted.push_back(t.tokens[want[j]]);
        if (!want.empty()) want_emitted.push_back(t.choice[want.back()]);
        ASSERT_EQ(len[b], static_cast<int>(want.size()));
        for (int j = 0; j < max_path; ++j) {
          const int32_t want_node = j < static_cast<int>(want.size()) ? want[j] : -1;
          const int32_t want_token = j < static_cast<int>(want.size()) ? want_emitted[j] : -1;
          ASSERT_EQ(path[static_cast<size_t>(b) * max_path + j], want_node) << "path[" << j << "]";
          ASSERT_EQ(emitted[static_cast<size_t>(b) * max_path + j], want_token)
              << "emitted[" << j << "]";
        }
      }
    }
  }
  // The planted choices produced long accepts (the 64-node full chain is accepted whole).
  EXPECT_GE(max_len_seen, 64);
}

}  // namespace
}  // namespace treespec::gpu
