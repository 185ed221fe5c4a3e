#include "common/model/cpu_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

// Unit roundoff of fp32.
constexpr double kU = std::numeric_limits<float>::epsilon() / 2;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool BitEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

using MatMulFn = void (*)(const float*, const float*, int, int, int, float*);

void Avx2OrSkip(const float* x, const float* w, int m, int n, int k, float* y) {
  internal::MatMulAvx2(x, w, m, n, k, y);
}

struct Kernel {
  const char* name;
  MatMulFn fn;
};

bool HaveAvx2() {
  float x = 1, w = 1, y = 0;
  return internal::MatMulAvx2(&x, &w, 1, 1, 1, &y);
}

std::vector<Kernel> Kernels() {
  std::vector<Kernel> k = {{"portable", internal::MatMulPortable}, {"dispatch", MatMul}};
  if (HaveAvx2()) k.push_back({"avx2", Avx2OrSkip});
  return k;
}

// |ŷ - y| <= (ceil(k / 8) + 4) u Σ|x_k w_k|: each of the 8 lanes adds ceil(k/8) terms in
// sequence (one rounding per add, plus one per product without FMA), then three levels of
// pairwise combination.
TEST(MatMulTest, MatchesDoubleReferenceWithinDerivedBound) {
  std::mt19937 rng(1);
  for (const Kernel& kernel : Kernels()) {
    for (int k : {1, 5, 8, 13, 64, 256, 704}) {
      const int m = 9, n = 11;
      const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
      std::vector<float> y(m * n, kPoison);
      kernel.fn(x.data(), w.data(), m, n, k, y.data());
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double ref = 0, abs_sum = 0;
          for (int e = 0; e < k; ++e) {
            const double p = static_cast<double>(x[i * k + e]) * w[j * k + e];
            ref += p;
            abs_sum += std::abs(p);
          }
          const double bound = ((k + 7) / 8 + 4) * kU * abs_sum;
          ASSERT_NEAR(y[i * n + j], ref, bound)
              << kernel.name << " k=" << k << " i=" << i << " j=" << j;
        }
      }
    }
  }
}

// The property the whole model relies on: a row's bits do not depend on the other rows of the
// call (m, and where the row falls in the 64-row panels and 4-row blocks) nor on which slice of
// w's rows is computed (the vocab-parallel LM head computes slices).
TEST(MatMulTest, RowsAndColumnsAreBatchInvariantBitwise) {
  std::mt19937 rng(2);
  for (const Kernel& kernel : Kernels()) {
    for (int k : {3, 8, 9, 100, 256}) {
      for (int m : {1, 2, 3, 4, 5, 7, 63, 64, 65, 70, 131}) {
        const int n = 13;
        const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
        std::vector<float> y(m * n, kPoison);
        kernel.fn(x.data(), w.data(), m, n, k, y.data());
        for (int i = 0; i < m; ++i) {
          std::vector<float> row(n, kPoison);
          kernel.fn(x.data() + i * k, w.data(), 1, n, k, row.data());
          ASSERT_TRUE(BitEqual(row.data(), y.data() + i * n, n))
              << kernel.name << " k=" << k << " m=" << m << " row " << i;
        }
        for (int j0 = 0; j0 < n; j0 += 5) {  // column slices [j0, j0 + 5)
          const int nj = std::min(5, n - j0);
          std::vector<float> part(m * nj, kPoison);
          kernel.fn(x.data(), w.data() + j0 * k, m, nj, k, part.data());
          for (int i = 0; i < m; ++i) {
            ASSERT_TRUE(BitEqual(part.data() + i * nj, y.data() + i * n + j0, nj))
                << kernel.name << " k=" << k << " m=" << m << " columns from " << j0;
          }
        }
      }
    }
  }
}

// DotRows is MatMul's arithmetic on unevenly strided rows, bit for bit.
TEST(AttentionHelpersTest, DotRowsEqualsMatMulBitwise) {
  std::mt19937 rng(3);
  for (int k : {1, 8, 17, 32, 128}) {
    const int count = 9, offset = 3;
    const std::vector<float> x = Random(rng, k), pool = Random(rng, 20 * (k + offset));
    std::vector<const float*> rows;
    std::vector<float> packed;  // the same rows, evenly strided
    for (int c = 0; c < count; ++c) {
      rows.push_back(pool.data() + ((c * 7) % 20) * (k + offset));
      packed.insert(packed.end(), rows.back() + offset, rows.back() + offset + k);
    }
    std::vector<float> scores(count, kPoison), want(count, kPoison);
    DotRows(x.data(), rows.data(), offset, count, k, scores.data());
    MatMul(x.data(), packed.data(), 1, count, k, want.data());
    EXPECT_TRUE(BitEqual(scores.data(), want.data(), count)) << "k=" << k;
  }
}

// Σ_c w_c row_c accumulates count terms in sequence: ≤ (count + 1) u Σ|w_c row_c|.
TEST(AttentionHelpersTest, WeightedSumRowsMatchesReference) {
  std::mt19937 rng(4);
  for (int k : {1, 8, 13, 32}) {
    const int count = 50, offset = 2;
    const std::vector<float> w = Random(rng, count), pool = Random(rng, count * (k + offset));
    std::vector<const float*> rows;
    for (int c = 0; c < count; ++c) rows.push_back(pool.data() + c * (k + offset));
    std::vector<float> out(k, kPoison);
    WeightedSumRows(w.data(), rows.data(), offset, count, k, out.data());
    for (int e = 0; e < k; ++e) {
      double ref = 0, abs_sum = 0;
      for (int c = 0; c < count; ++c) {
        ref += static_cast<double>(w[c]) * rows[c][offset + e];
        abs_sum += std::abs(static_cast<double>(w[c]) * rows[c][offset + e]);
      }
      EXPECT_NEAR(out[e], ref, (count + 1) * kU * abs_sum) << "k=" << k << " e=" << e;
    }
  }
}

TEST(RmsNormTest, MatchesDoubleReference) {
  std::mt19937 rng(4);
  const int m = 5, n = 96;
  const float eps = 1e-5f;
  const std::vector<float> x = Random(rng, m * n, 3.0f), w = Random(rng, n);
  std::vector<float> y(m * n, kPoison);
  RmsNorm(x.data(), w.data(), m, n, eps, y.data());
  for (int i = 0; i < m; ++i) {
    double ss = 0;
    for (int j = 0; j < n; ++j) ss += static_cast<double>(x[i * n + j]) * x[i * n + j];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int j = 0; j < n; ++j) {
      const double ref = w[j] * (x[i * n + j] * inv);
      // mean, +eps, sqrt, reciprocal, two products: six roundings, two ulps of slack.
      EXPECT_NEAR(y[i * n + j], ref, 8 * kU * std::abs(ref)) << i << "," << j;
    }
  }
  // In place gives the same bits.
  std::vector<float> z = x;
  RmsNorm(z.data(), w.data(), m, n, eps, z.data());
  EXPECT_TRUE(BitEqual(z.data(), y.data(), z.size()));
}

TEST(RopeTest, TablesAndRotationMatchReference) {
  std::mt19937 rng(5);
  const int head_dim = 16, half = 8, heads = 3;
  std::vector<float> inv_freq(half);
  for (int f = 0; f < half; ++f) inv_freq[f] = std::pow(10000.0f, -2.0f * f / head_dim);
  const std::vector<int> positions = {0, 1, 7, 300, 4095};
  const int m = static_cast<int>(positions.size());
  const float attention_factor = 1.25f;
  std::vector<float> cos(m * half, kPoison), sin(m * half, kPoison);
  RopeTables(inv_freq, attention_factor, positions, cos.data(), sin.data());
  const std::vector<float> x = Random(rng, m * heads * head_dim);
  std::vector<float> y = x;
  ApplyRope(cos.data(), sin.data(), m, heads, head_dim, y.data());
  for (int i = 0; i < m; ++i) {
    for (int f = 0; f < half; ++f) {
      const float angle = static_cast<float>(positions[i]) * inv_freq[f];  // fp32, as HF
      const double c = std::cos(static_cast<double>(angle)) * attention_factor;
      const double s = std::sin(static_cast<double>(angle)) * attention_factor;
      EXPECT_NEAR(cos[i * half + f], c, 2 * kU * attention_factor);
      EXPECT_NEAR(sin[i * half + f], s, 2 * kU * attention_factor);
      for (int h = 0; h < heads; ++h) {
        const float* xv = x.data() + (i * heads + h) * head_dim;
        const float* yv = y.data() + (i * heads + h) * head_dim;
        const double a = xv[f], b = xv[f + half];
        // Rotate-half: (a, b) -> (a c - b s, b c + a s); table rounding (2u) plus three.
        const double tol = 5 * kU * (std::abs(a) + std::abs(b)) * attention_factor;
        EXPECT_NEAR(yv[f], a * c - b * s, tol) << i << " " << f;
        EXPECT_NEAR(yv[f + half], b * c + a * s, tol) << i << " " << f;
      }
    }
  }
  // Position 0 with factor 1 is the identity.
  std::vector<float> c0(half), s0(half), z(x.begin(), x.begin() + head_dim);
  RopeTables(inv_freq, 1.0f, std::vector<int>{0}, c0.data(), s0.data());
  ApplyRope(c0.data(), s0.data(), 1, 1, head_dim, z.data());
  EXPECT_TRUE(BitEqual(z.data(), x.data(), head_dim));
}

TEST(SiluMulTest, MatchesReference) {
  std::mt19937 rng(6);
  const std::vector<float> g = Random(rng, 300, 4.0f), u = Random(rng, 300);
  std::vector<float> out(300, kPoison);
  SiluMul(g.data(), u.data(), 300, out.data());
  for (int i = 0; i < 300; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    // exp (libm, ≤ 1 ulp here), add, divide, multiply.
    EXPECT_NEAR(out[i], ref, 8 * kU * std::abs(ref) + 1e-30) << i;
  }
}

TEST(SoftmaxTest, MatchesReferenceAndSumsToOne) {
  std::mt19937 rng(7);
  const int n = 100;
  std::vector<float> x = Random(rng, n, 5.0f);
  const std::vector<float> in = x;
  SoftmaxInPlace(absl::MakeSpan(x));
  double max = in[0];
  for (float v : in) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : in) sum += std::exp(v - max);
  for (int i = 0; i < n; ++i) {
    const double ref = std::exp(in[i] - max) / sum;
    // exp 2u, the fp32 sum of n terms n·u relative, reciprocal and product 2u.
    EXPECT_NEAR(x[i], ref, (n + 6) * kU * ref) << i;
  }
}

}  // namespace
}  // namespace treespec
