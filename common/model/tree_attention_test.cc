#include "common/model/tree_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/model/kv_cache.h"
#include "common/tree/token_tree.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

constexpr double kU = std::numeric_limits<float>::epsilon() / 2;
constexpr int kLayers = 2, kPageSize = 16, kKvHeads = 2, kQHeads = 6, kHeadDim = 16;

// A sequence with random K/V in every reserved slot of every layer.
struct Fixture {
  Fixture(int num_slots, uint32_t seed)
      : cache(64, kPageSize), pool(kLayers, 64, kPageSize, kKvHeads, kHeadDim), rng(seed) {
    seq = cache.CreateSequence();
    // Interleave with another sequence so the page table is 0, 2, 4, ..., not contiguous.
    const SeqId other = cache.CreateSequence();
    for (int p = 1; (p - 1) * kPageSize < num_slots; ++p) {
      EXPECT_TRUE(cache.Reserve(seq, std::min(num_slots, p * kPageSize)).ok());
      EXPECT_TRUE(cache.Reserve(other, p * kPageSize).ok());
    }
    pages = cache.Pages(seq);
    EXPECT_GT(pages.size() > 1 ? pages[1] - pages[0] : 2, 1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int l = 0; l < kLayers; ++l) {
      for (int s = 0; s < num_slots; ++s) {
        float* k = pool.K(l, pages[s / kPageSize], s % kPageSize);
        float* v = pool.V(l, pages[s / kPageSize], s % kPageSize);
        for (int e = 0; e < kKvHeads * kHeadDim; ++e) {
          k[e] = d(rng);
          v[e] = d(rng);
        }
      }
    }
  }
  std::vector<float> RandomQ(int rows) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> q(rows * kQHeads * kHeadDim);
    for (float& x : q) x = d(rng);
    return q;
  }
  PagedKvCache cache;
  KvPool pool;
  std::mt19937 rng;
  SeqId seq;
  std::vector<int> pages;
};

// GQA: q heads 0-2 read KV head 0, 3-5 KV head 1.
const std::vector<int> kKvHeadOfQ = {0, 0, 0, 1, 1, 1};
const AttentionHeads kHeads{kKvHeadOfQ, kHeadDim, kHeadDim};

std::vector<int32_t> RandomParents(std::mt19937& rng, int n) {
  std::vector<int32_t> parents(n);
  for (int i = 0; i < n; ++i) {
    parents[i] = i == 0 ? -1 : std::uniform_int_distribution<int>(-1, i - 1)(rng);
  }
  return parents;
}

// Dense masked attention in double over slots [0, L + n): node i sees slot s iff s < L or
// s - L is i or an ancestor of i.
void CheckAgainstDense(Fixture& f, int L, const std::vector<int32_t>& parents, int first_query) {
  const int n = static_cast<int>(parents.size()), queries = n - first_query;
  const std::vector<uint64_t> mask = AncestorMask(parents);
  const std::vector<float> q = f.RandomQ(queries);
  std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
  TreeAttentionScratch scratch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const int layer = 1;
  TreeAttention(f.pool, layer, kPageSize, {f.pages, L, n, first_query, mask}, kHeads, scale,
                q.data(), out.data(), &scratch);

  std::vector<std::vector<bool>> sees(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = i; j >= 0; j = parents[j]) sees[i][j] = true;
  }
  for (int qi = 0; qi < queries; ++qi) {
    const int i = first_query + qi;
    for (int h = 0; h < kQHeads; ++h) {
      const int g = kKvHeadOfQ[h];
      const float* qh = q.data() + (qi * kQHeads + h) * kHeadDim;
      std::vector<int> slots;
      for (int s = 0; s < L + n; ++s) {
        if (s < L || sees[i][s - L]) slots.push_back(s);
      }
      std::vector<double> p;
      double max = -INFINITY;
      for (int s : slots) {
        const float* k = f.pool.K(layer, f.pages[s / kPageSize], s % kPageSize) + g * kHeadDim;
        double dot = 0;
        for (int e = 0; e < kHeadDim; ++e) dot += static_cast<double>(qh[e]) * k[e];
        p.push_back(dot * scale);
        max = std::max(max, p.back());
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - max));
      for (int e = 0; e < kHeadDim; ++e) {
        double ref = 0, abs_ref = 0;
        for (size_t c = 0; c < slots.size(); ++c) {
          const int s = slots[c];
          const float v = f.pool.V(layer, f.pages[s / kPageSize], s % kPageSize)[g * kHeadDim + e];
          ref += p[c] / sum * v;
          abs_ref += p[c] / sum * std::abs(v);
        }
        // Scores carry (d/8 + 5)u relative error of Σ|q_e k_e| (generously 4d here); a score
        // error δ perturbs p by ≈ δ relative. The softmax sum and the weighted
        // sum over c slots add (c + 4)u. Bound: ((c + 4) u + score error) * Σ p |v|.
        const double score_err = (kHeadDim / 8 + 5) * kU * kHeadDim * 4.0;
        const double tol = ((slots.size() + 4) * kU + 2 * score_err) * abs_ref + 1e-7;
        ASSERT_NEAR(out[(qi * kQHeads + h) * kHeadDim + e], ref, tol)
            << "node " << i << " head " << h << " dim " << e;
      }
    }
  }
}

TEST(TreeAttentionTest, RandomTreeMatchesDenseMaskedAttention) {
  for (uint32_t seed = 0; seed < 5; ++seed) {
    Fixture f(/*num_slots=*/37 + 30, seed);
    CheckAgainstDense(f, /*L=*/37, RandomParents(f.rng, 30), /*first_query=*/0);
  }
}

TEST(TreeAttentionTest, ForestAndWideTreeOverManyMaskWords) {
  // 70 nodes span two mask words; several roots (a forest) and queries from node 10 on.
  Fixture f(/*num_slots=*/5 + 70, 11);
  CheckAgainstDense(f, /*L=*/5, RandomParents(f.rng, 70), /*first_query=*/10);
}

TEST(TreeAttentionTest, EmptyPrefix) {
  Fixture f(/*num_slots=*/20, 12);
  CheckAgainstDense(f, /*L=*/0, RandomParents(f.rng, 20), /*first_query=*/0);
}

// A chain over slots [L, L + n) gives, for node i, bit-identical output to a single-node tree
// at committed length L + i: the slot order and every operation are the same.
TEST(TreeAttentionTest, ChainEqualsCausalDecodeBitwise) {
  const int L = 19, n = 25;
  Fixture f(L + n, 13);
  std::vector<int32_t> chain(n);
  for (int i = 0; i < n; ++i) chain[i] = i - 1;
  const std::vector<uint64_t> mask = AncestorMask(chain);
  const std::vector<float> q = f.RandomQ(n);
  const int row = kQHeads * kHeadDim;
  std::vector<float> out(q.size());
  TreeAttentionScratch scratch;
  const float scale = 0.25f;
  TreeAttention(f.pool, 0, kPageSize, {f.pages, L, n, 0, mask}, kHeads, scale, q.data(), out.data(),
                &scratch);
  const std::vector<uint64_t> one = AncestorMask(std::vector<int32_t>{-1});
  for (int i = 0; i < n; ++i) {
    std::vector<float> single(row, std::numeric_limits<float>::quiet_NaN());
    TreeAttention(f.pool, 0, kPageSize, {f.pages, L + i, 1, 0, one}, kHeads, scale,
                  q.data() + i * row, single.data(), &scratch);
    ASSERT_EQ(std::memcmp(single.data(), out.data() + i * row, row * sizeof(float)), 0)
        << "node " << i;
  }
}

}  // namespace
}  // namespace treespec
