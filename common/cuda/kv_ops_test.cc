// The paged-KV ops against their CPU semantics (DESIGN §3 steps 1 and 5, §8): LaunchKvWrite
// against per-head RmsNorm + RopeTables + ApplyRope (common/model/cpu_ops.h) and the cache write
// of CpuCausalLm, LaunchKvCommit against a host-side run of CommitPath's ascending copies.
// Inputs are random bf16 (the CPU gets the very same values), the pool and every output are
// poisoned first (bf16 NaN) and must keep the poison wherever nothing is to be written, guard
// tails included. Skips every test without a CUDA device. Tolerances and seeds as described in
// cuda_test_util.h.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kv_commit.h"
#include "common/cuda/kv_write.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/rope.h"
#include "common/model/cpu_ops.h"
#include "common/model/dtype.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding
using KvOpsTest = CudaTest;

constexpr int kPageSize = 16;

// Llama-style inverse frequencies theta^(-2f / head_dim), as fp32.
std::vector<float> InverseFrequencies(int head_dim, double theta) {
  std::vector<float> inv(head_dim / 2);
  for (int f = 0; f < head_dim / 2; ++f) {
    inv[f] = static_cast<float>(std::pow(theta, -2.0 * f / head_dim));
  }
  return inv;
}

// Norm weights around 1 (1 ± 0.5), as trained norms are.
Bf16Data NormWeights(std::mt19937_64& rng, int n) {
  Bf16Data w = RandomBf16(rng, n, 0.5f);
  for (int j = 0; j < n; ++j) {
    const uint16_t bits = FloatToBf16Bits(1.0f + w.f[j]);
    w.bf[j] = FromBits(bits);
    w.f[j] = Bf16BitsToFloat(bits);
  }
  return w;
}

// ---- KV write. Per row: q and k heads normalised (Qwen3) and rotated, v as is; q to q_out, k
// and v to the row's slot of the paged pool unless the slot is negative.
// Tolerance: with qk-norm the GPU's normalised fp32 values y differ from the CPU's by
// delta·|y|, delta = (head_dim/2 + 16)·e (the RMSNorm bound of cuda_ops_test.cc with n =
// head_dim); the rotation then adds, as in RopeMatchesCpu, 8·af·e·(|a| + |b|) with a, b the
// pair's normalised CPU values, and carries the norm's error as delta·af·(|a| + |b|). So
//   d <= (delta + 8e)·af·(|a| + |b|),  tol = u·|ref| + 2·(delta + 8e)·af·(|a| + |b|).
// v is a copy: bit-exact. Without a norm, q_out and K must also equal LaunchRope's output bit
// for bit (same table, same explicit roundings).
enum class Norm { kNone, kBoth, kQOnly };

TEST_F(KvOpsTest, KvWriteMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr float kEps = 1e-6f;
  struct Case {
    int rows, hq, hkv, head_dim;
    Norm norm;
    float attention_factor;
    bool misaligned;  // qkv one element off 16 bytes: the scalar path even for head_dim 128
  };
  // head_dim 64/128 take the 16-byte path with 4/8 lanes per head; 96 has 6 packs for 8 lanes,
  // 512 one pack per lane of 32, 1024 two; 6 and the misaligned case run the scalar path (the
  // latter with two pairs of packs per lane, so the norm's two passes loop).
  for (const Case c :
       {Case{1, 32, 8, 128, Norm::kBoth, 1.0f, false}, Case{3, 8, 4, 64, Norm::kNone, 1.0f, false},
        Case{17, 14, 2, 64, Norm::kBoth, 1.0f, false},
        Case{255, 32, 8, 128, Norm::kNone, 1.0f, false},
        Case{255, 8, 4, 64, Norm::kBoth, 1.0f, false},
        Case{17, 32, 8, 128, Norm::kBoth, 1.2079f, false},
        Case{3, 14, 2, 128, Norm::kQOnly, 1.0f, false},
        Case{17, 8, 4, 128, Norm::kBoth, 1.0f, true}, Case{17, 8, 4, 128, Norm::kNone, 1.0f, true},
        Case{17, 4, 2, 96, Norm::kBoth, 1.0f, false}, Case{3, 3, 1, 6, Norm::kBoth, 1.0f, false},
        Case{3, 2, 1, 512, Norm::kBoth, 0.9f, false},
        Case{3, 2, 2, 1024, Norm::kBoth, 1.0f, false}}) {
    SCOPED_TRACE(absl::StrCat("rows ", c.rows, " q heads ", c.hq, " kv heads ", c.hkv, " head_dim ",
                              c.head_dim, " norm ", static_cast<int>(c.norm), " attention_factor ",
                              c.attention_factor, " misaligned ", c.misaligned));
    const int d = c.head_dim, half = d / 2, total_heads = c.hq + 2 * c.hkv;
    const size_t row_width = static_cast<size_t>(total_heads) * d;
    const Bf16Data qkv = RandomBf16(rng_, c.rows * row_width, 3.0f);
    const std::vector<float> inv_freq = InverseFrequencies(d, 1000000.0);
    const bool q_normed = c.norm != Norm::kNone, k_normed = c.norm == Norm::kBoth;
    const Bf16Data q_norm = NormWeights(rng_, d), k_norm = NormWeights(rng_, d);

    // Positions up to 128k, with the identity rotation, a few small ones and a large one.
    std::uniform_int_distribution<int32_t> pos(0, 131071);
    std::vector<int32_t> positions(c.rows);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = c.rows > 1 ? 0 : 100000;
    if (c.rows > 1) positions[1] = 100000;
    if (c.rows > 2) positions[2] = 3;

    // Distinct random slots of a pool with spare pages (the last slot of the pool among them),
    // about a quarter of them negative: those rows write no K/V.
    const int num_pages = (c.rows + kPageSize - 1) / kPageSize + 2;
    const int num_slots = num_pages * kPageSize;
    std::vector<int32_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    std::swap(*std::find(slots.begin(), slots.end(), num_slots - 1), slots[c.rows - 1]);
    slots.resize(c.rows);
    for (int i = 0; i + 1 < c.rows; ++i) {  // the last row keeps the pool's last slot
      if (rng_() % 4 == 0) slots[i] = -1 - static_cast<int32_t>(rng_() % 1000);
    }
    if (c.rows > 2) slots[c.rows / 2] = -1;
    if (c.rows > 4) slots[3] = num_slots;  // beyond the pool: not written either
    auto written = [&](int i) { return slots[i] >= 0 && slots[i] < num_slots; };
    int written_rows = 0;
    for (int i = 0; i < c.rows; ++i) written_rows += written(i) ? 1 : 0;

    // CPU reference: the layer's path in CpuCausalLm (per-head norm, then RoPE).
    const size_t q_count = static_cast<size_t>(c.rows) * c.hq * d;
    const size_t kv_count = static_cast<size_t>(c.rows) * c.hkv * d;
    std::vector<float> q(q_count), k(kv_count);
    for (int i = 0; i < c.rows; ++i) {
      const float* row = qkv.f.data() + i * row_width;
      std::copy_n(row, c.hq * d, q.data() + static_cast<size_t>(i) * c.hq * d);
      std::copy_n(row + c.hq * d, c.hkv * d, k.data() + static_cast<size_t>(i) * c.hkv * d);
    }
    if (q_normed) RmsNorm(q.data(), q_norm.f.data(), c.rows * c.hq, d, kEps, q.data());
    if (k_normed) RmsNorm(k.data(), k_norm.f.data(), c.rows * c.hkv, d, kEps, k.data());
    const std::vector<float> q_pre = q, k_pre = k;  // the pairs (a, b) of the tolerance
    std::vector<float> cos(static_cast<size_t>(c.rows) * half), sin(cos.size());
    RopeTables(inv_freq, c.attention_factor, positions, cos.data(), sin.data());
    ApplyRope(cos.data(), sin.data(), c.rows, c.hq, d, q.data());
    ApplyRope(cos.data(), sin.data(), c.rows, c.hkv, d, k.data());

    const int offset = c.misaligned ? 1 : 0;
    std::vector<bf16> qkv_host = qkv.bf;
    qkv_host.insert(qkv_host.begin(), offset, FromBits(kPoisonBits));
    ASSERT_OK_AND_ASSIGN(auto d_qkv, Upload(qkv_host));
    ASSERT_OK_AND_ASSIGN(auto d_positions, Upload(positions));
    ASSERT_OK_AND_ASSIGN(auto d_slots, Upload(slots));
    ASSERT_OK_AND_ASSIGN(auto d_inv_freq, Upload(inv_freq));
    ASSERT_OK_AND_ASSIGN(auto d_q_norm, Upload(q_norm.bf));
    ASSERT_OK_AND_ASSIGN(auto d_k_norm, Upload(k_norm.bf));
    const size_t pool_count = static_cast<size_t>(num_pages) * c.hkv * kPageSize * d;
    ASSERT_OK_AND_ASSIGN(auto d_k, Poisoned(pool_count));
    ASSERT_OK_AND_ASSIGN(auto d_v, Poisoned(pool_count));
    ASSERT_OK_AND_ASSIGN(auto d_q_out, Poisoned(q_count));
    KvLayerView layer;
    layer.k = d_k.data();
    layer.v = d_v.data();
    layer.num_pages = num_pages;
    layer.page_size = kPageSize;
    layer.num_kv_heads = c.hkv;
    layer.head_dim = d;
    ASSERT_CUDA(LaunchKvWrite(
        d_qkv.data() + offset, c.rows, c.hq, c.hkv, d, d_positions.data(), d_slots.data(),
        d_inv_freq.data(), c.attention_factor, q_normed ? d_q_norm.data() : nullptr,
        k_normed ? d_k_norm.data() : nullptr, kEps, d_q_out.data(), layer, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_q, Download(d_q_out));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_k, Download(d_k));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_v, Download(d_v));

    const double q_delta = q_normed ? (d / 2.0 + 16) * kFp32U : 0;
    const double k_delta = k_normed ? (d / 2.0 + 16) * kFp32U : 0;
    // Element e of a [.., head_dim] array of rotated values `ref` with pre-rotation values `pre`.
    auto tolerance = [&](const std::vector<float>& ref, const std::vector<float>& pre, size_t e,
                         double delta) {
      const size_t head_base = e - e % d;
      const int f = static_cast<int>(e % d) % half;
      const double a = pre[head_base + f], b = pre[head_base + f + half];
      return kBf16U * std::abs(ref[e]) +
             2 * (delta + 8 * kFp32U) * c.attention_factor * (std::abs(a) + std::abs(b));
    };
    for (size_t e = 0; e < q_count; ++e) {
      ASSERT_LE(std::abs(ToFloat(got_q[e]) - q[e]), tolerance(q, q_pre, e, q_delta))
          << "q_out row " << e / (static_cast<size_t>(c.hq) * d) << " head " << e / d % c.hq
          << " element " << e % d << ": got " << ToFloat(got_q[e]) << " want " << q[e];
    }
    ExpectGuardIntact(got_q, q_count);

    // The pool: the written rows' K (tolerance) and V (exact) at their slots, poison elsewhere.
    std::vector<int> row_of_slot(num_slots, -1);
    for (int i = 0; i < c.rows; ++i) {
      if (written(i)) row_of_slot[slots[i]] = i;
    }
    for (int s = 0; s < num_slots; ++s) {
      const int page = s / kPageSize, in_page = s % kPageSize, i = row_of_slot[s];
      for (int h = 0; h < c.hkv; ++h) {
        const size_t at = layer.Offset(page, h, in_page);
        const size_t ref_at = (static_cast<size_t>(i) * c.hkv + h) * d;
        for (int j = 0; j < d; ++j) {
          if (i < 0) {
            ASSERT_EQ(Bits(got_k[at + j]), kPoisonBits) << "K written at unused slot " << s;
            ASSERT_EQ(Bits(got_v[at + j]), kPoisonBits) << "V written at unused slot " << s;
            continue;
          }
          ASSERT_LE(std::abs(ToFloat(got_k[at + j]) - k[ref_at + j]),
                    tolerance(k, k_pre, ref_at + j, k_delta))
              << "K of row " << i << " (slot " << s << ") head " << h << " element " << j
              << ": got " << ToFloat(got_k[at + j]) << " want " << k[ref_at + j];
          ASSERT_EQ(Bits(got_v[at + j]),
                    Bits(qkv.bf[i * row_width + static_cast<size_t>(c.hq + c.hkv + h) * d + j]))
              << "V of row " << i << " (slot " << s << ") head " << h << " element " << j;
        }
      }
    }
    ExpectGuardIntact(got_k, pool_count);
    ExpectGuardIntact(got_v, pool_count);
    if (c.rows > 2) {
      EXPECT_LT(written_rows, c.rows);  // the negative-slot path ran
    }

    if (c.norm != Norm::kNone) continue;
    // Without norms: bit for bit LaunchRope on the whole qkv row (its v heads ignored).
    ASSERT_OK_AND_ASSIGN(auto d_rope, Upload(qkv.bf));
    ASSERT_CUDA(LaunchRope(d_rope.data(), c.rows, total_heads, d, d_positions.data(),
                           d_inv_freq.data(), c.attention_factor, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> rope, Download(d_rope));
    for (int i = 0; i < c.rows; ++i) {
      for (int h = 0; h < c.hq + c.hkv; ++h) {
        const bool is_q = h < c.hq;
        if (!is_q && !written(i)) continue;
        const size_t got_at =
            is_q ? (static_cast<size_t>(i) * c.hq + h) * d
                 : layer.Offset(slots[i] / kPageSize, h - c.hq, slots[i] % kPageSize);
        for (int j = 0; j < d; ++j) {
          ASSERT_EQ(Bits((is_q ? got_q : got_k)[got_at + j]),
                    Bits(rope[i * row_width + static_cast<size_t>(h) * d + j]))
              << (is_q ? "q" : "k") << " of row " << i << " head " << h << " element " << j
              << " differs from LaunchRope";
        }
      }
    }
  }
}

// ---- KV commit. A batch of sequences over random page tables (page_size 16), each with its
// committed length L and accepted path; the pool after the launch must equal, bit for bit and
// everywhere, the pool after CommitPath's ascending copies run on the host.

// Pool shape, and where the data lies in one host/device buffer: layer l's K at
// offset + 2 l · layer_elements, its V at offset + (2 l + 1) · layer_elements (DeviceKvPool's
// layout, so layer_stride = 2 · layer_elements).
struct PoolShape {
  int num_layers, num_pages, num_kv_heads, head_dim;
  int offset;  // elements before layer 0's K (1 makes every slot misaligned)

  size_t LayerElements() const {
    return static_cast<size_t>(num_pages) * num_kv_heads * kPageSize * head_dim;
  }
  size_t Count() const { return offset + 2 * num_layers * LayerElements(); }
  // Element (layer, K = 0 / V = 1, page, head, offset in page, 0).
  size_t At(int layer, int kv, int page, int head, int in_page) const {
    return offset + (2 * static_cast<size_t>(layer) + kv) * LayerElements() +
           ((static_cast<size_t>(page) * num_kv_heads + head) * kPageSize + in_page) * head_dim;
  }
  // Layer 0 of a pool of this shape at `pool` (the next layers 2 * LayerElements() apart).
  KvLayerView Layer0(bf16* pool) const {
    KvLayerView layer;
    layer.k = pool + At(0, 0, 0, 0, 0);
    layer.v = pool + At(0, 1, 0, 0, 0);
    layer.num_pages = num_pages;
    layer.page_size = kPageSize;
    layer.num_kv_heads = num_kv_heads;
    layer.head_dim = head_dim;
    return layer;
  }
};

// One sequence of the batch: committed length, page table (reserved slots) and path.
struct CommitSeq {
  int committed_len;
  std::vector<int32_t> pages;
  std::vector<int32_t> path;  // its first path_len entries are the path; may be longer
  int path_len;
};

// CommitPath's preconditions (common/model/kv_cache.cc); the kernel skips a row that breaks
// them, where CommitPath aborts.
bool CommitIsValid(const CommitSeq& s, int max_path) {
  if (s.path_len < 2) return false;  // nothing to do (for path_len 1 CommitPath copies nothing)
  if (s.path_len > max_path || s.committed_len < 0 || s.path[0] != 0) return false;
  for (int j = 1; j < s.path_len; ++j) {
    if (s.path[j] <= s.path[j - 1]) return false;
  }
  return static_cast<int64_t>(s.committed_len) + s.path[s.path_len - 1] <
         static_cast<int64_t>(s.pages.size()) * kPageSize;
}

// CommitPath's copies, ascending, on the host pool.
void SimulateCommit(const PoolShape& shape, const std::vector<CommitSeq>& batch, int max_path,
                    std::vector<bf16>& pool) {
  for (const CommitSeq& s : batch) {
    if (!CommitIsValid(s, max_path)) continue;
    for (int j = 1; j < s.path_len; ++j) {
      if (s.path[j] == j) continue;
      const int src = s.committed_len + s.path[j], dst = s.committed_len + j;
      for (int layer = 0; layer < shape.num_layers; ++layer) {
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < shape.num_kv_heads; ++h) {
            std::copy_n(
                pool.begin() + shape.At(layer, kv, s.pages[src / kPageSize], h, src % kPageSize),
                shape.head_dim,
                pool.begin() + shape.At(layer, kv, s.pages[dst / kPageSize], h, dst % kPageSize));
          }
        }
      }
    }
  }
}

// A random accepted path of a tree of `tree_nodes` nodes: 0 then up to max_len - 1 distinct
// sorted nodes of [1, tree_nodes).
std::vector<int32_t> RandomPath(std::mt19937_64& rng, int tree_nodes, int max_len) {
  std::vector<int32_t> nodes(tree_nodes - 1);
  std::iota(nodes.begin(), nodes.end(), 1);
  std::shuffle(nodes.begin(), nodes.end(), rng);
  const int k = static_cast<int>(rng() % std::min(max_len, tree_nodes));
  nodes.resize(k);
  std::sort(nodes.begin(), nodes.end());
  nodes.insert(nodes.begin(), 0);
  return nodes;
}

// The test batch: hand-picked paths (the in-place hazard, identity, gaps across pages, nothing
// to do, invalid ones) and random ones, each sequence's pages drawn from one shuffled pool so
// that tables are neither contiguous nor ordered. Sets num_pages: the pages used plus spares.
std::vector<CommitSeq> CommitBatch(std::mt19937_64& rng, int max_path, int& num_pages) {
  struct Spec {
    int committed_len;
    std::vector<int32_t> path;
    int reserved_nodes;  // tree slots reserved after L (0: the path's last node + 1)
  };
  std::vector<Spec> specs = {
      {0, {0, 2, 3}, 0},               // copy 2 overwrites copy 1's source: order matters
      {15, {0, 1, 2, 3, 4}, 0},        // identity: nothing moves
      {16, {0}, 5},                    // path_len 1: nothing to do
      {13, {0, 5, 6, 30, 31, 47}, 0},  // gaps, across three pages
      {37, {0, 1, 3, 4, 9}, 12},       // identity first, then moves
      {9, {0, 7}, 0},                  // one move within a page
      {20, {0, 3, 2}, 0},              // invalid: not increasing
      {30, {0, 4, 40}, 21},            // invalid: beyond the reserved slots
      {8, {1, 2, 5}, 0},               // invalid: does not start at node 0
  };
  // Random ones, one of them as long as max_path allows.
  for (int r = 0; r < 6; ++r) {
    const int tree_nodes = r == 0 ? 64 : 1 + static_cast<int>(rng() % 64);
    specs.push_back({static_cast<int>(rng() % 200), RandomPath(rng, tree_nodes, max_path), 0});
  }
  {
    std::vector<int32_t> longest(max_path);
    std::iota(longest.begin(), longest.end(), 0);
    longest.back() = 60;  // identity but the last node
    specs.push_back({100, longest, 0});
  }

  std::vector<CommitSeq> batch;
  int pages_needed = 0;
  for (const Spec& spec : specs) {
    CommitSeq s;
    s.committed_len = spec.committed_len;
    s.path = spec.path;
    s.path_len = static_cast<int>(spec.path.size());
    const int reserved_nodes =
        spec.reserved_nodes > 0
            ? spec.reserved_nodes
            : *std::max_element(s.path.begin(), s.path.end()) + 1 + static_cast<int>(rng() % 8);
    s.pages.resize((s.committed_len + reserved_nodes + kPageSize - 1) / kPageSize);
    pages_needed += static_cast<int>(s.pages.size());
    batch.push_back(std::move(s));
  }
  {
    CommitSeq idle;  // path_len 0: an idle row of a fixed-size batch
    idle.committed_len = 5;
    idle.pages.resize(1);
    idle.path = {7, 3};
    idle.path_len = 0;
    pages_needed += 1;
    batch.push_back(std::move(idle));
  }
  std::shuffle(batch.begin(), batch.end(), rng);
  num_pages = pages_needed + 5;  // spare pages must keep their contents
  std::vector<int32_t> free_pages(num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  for (CommitSeq& s : batch) {
    for (int32_t& p : s.pages) {
      p = free_pages.back();
      free_pages.pop_back();
    }
  }
  return batch;
}

// Device arrays of a batch: [num_seqs] lengths, [num_seqs, max_path] paths with garbage past
// each path_len, [num_seqs] path_len, and the CSR page tables.
struct CommitArrays {
  std::vector<int32_t> committed_len, path, path_len, page_table, page_offsets;
};
CommitArrays Flatten(const std::vector<CommitSeq>& batch, int max_path) {
  CommitArrays a;
  a.page_offsets.push_back(0);
  for (const CommitSeq& s : batch) {
    a.committed_len.push_back(s.committed_len);
    std::vector<int32_t> row(max_path, -7);
    std::copy_n(s.path.begin(), std::min<size_t>(s.path.size(), max_path), row.begin());
    a.path.insert(a.path.end(), row.begin(), row.end());
    a.path_len.push_back(s.path_len);
    a.page_table.insert(a.page_table.end(), s.pages.begin(), s.pages.end());
    a.page_offsets.push_back(static_cast<int32_t>(a.page_table.size()));
  }
  return a;
}

std::vector<bf16> RandomBits(std::mt19937_64& rng, size_t count) {
  std::vector<bf16> v(count);
  for (bf16& x : v) x = FromBits(static_cast<uint16_t>(rng()));
  return v;
}

std::string BatchString(const std::vector<CommitSeq>& batch) {
  std::string out = "batch:";
  for (const CommitSeq& s : batch) {
    absl::StrAppend(&out, "\n  L ", s.committed_len, " pages [", absl::StrJoin(s.pages, ", "),
                    "] path_len ", s.path_len, " path [", absl::StrJoin(s.path, ", "), "]");
  }
  return out;
}

// Every element of `got` (payload and guard) equals `want`; names the first difference.
void ExpectPoolEquals(const PoolShape& shape, const std::vector<bf16>& got,
                      const std::vector<bf16>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < got.size(); ++e) {
    if (Bits(got[e]) == Bits(want[e])) continue;
    if (e < static_cast<size_t>(shape.offset) || e >= shape.Count())
      FAIL() << "write outside the pool at " << e;
    const size_t rel = e - shape.offset;
    const size_t tensor = rel / shape.LayerElements(), in_layer = rel % shape.LayerElements();
    const size_t slot_row = in_layer / shape.head_dim;  // (page, head, offset)
    FAIL() << "layer " << tensor / 2 << (tensor % 2 == 0 ? " K" : " V") << " page "
           << slot_row / kPageSize / shape.num_kv_heads << " head "
           << slot_row / kPageSize % shape.num_kv_heads << " offset " << slot_row % kPageSize
           << " element " << in_layer % shape.head_dim << ": got " << Bits(got[e]) << " want "
           << Bits(want[e]);
  }
}

TEST_F(KvOpsTest, KvCommitMatchesHostCopies) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr int kMaxPath = 24;
  struct Case {
    int num_layers, num_kv_heads, head_dim, offset;
  };
  // head_dim 128 and 64 take the 16-byte path, 6 and the misaligned pool the scalar one.
  for (const Case c : {Case{3, 2, 128, 0}, Case{2, 4, 64, 0}, Case{1, 8, 128, 0}, Case{2, 2, 6, 0},
                       Case{3, 2, 128, 1}}) {
    SCOPED_TRACE(absl::StrCat("layers ", c.num_layers, " kv heads ", c.num_kv_heads, " head_dim ",
                              c.head_dim, " offset ", c.offset));
    int num_pages = 0;
    const std::vector<CommitSeq> batch = CommitBatch(rng_, kMaxPath, num_pages);
    int invalid = 0;  // rows with something to do that the kernel must skip
    for (const CommitSeq& s : batch) invalid += s.path_len >= 2 && !CommitIsValid(s, kMaxPath);
    ASSERT_EQ(invalid, 3) << "the three hand-picked invalid paths of CommitBatch";
    SCOPED_TRACE(BatchString(batch));

    const PoolShape shape{c.num_layers, num_pages, c.num_kv_heads, c.head_dim, c.offset};
    std::vector<bf16> pool = RandomBits(rng_, shape.Count());
    ASSERT_OK_AND_ASSIGN(auto d_pool, Upload(pool));
    const CommitArrays a = Flatten(batch, kMaxPath);
    ASSERT_OK_AND_ASSIGN(auto d_len, Upload(a.committed_len));
    ASSERT_OK_AND_ASSIGN(auto d_path, Upload(a.path));
    ASSERT_OK_AND_ASSIGN(auto d_path_len, Upload(a.path_len));
    ASSERT_OK_AND_ASSIGN(auto d_table, Upload(a.page_table));
    ASSERT_OK_AND_ASSIGN(auto d_offsets, Upload(a.page_offsets));
    const KvLayerView layer0 = shape.Layer0(d_pool.data());
    DevicePageTables tables{d_table.data(), d_offsets.data()};
    ASSERT_CUDA(LaunchKvCommit(layer0, c.num_layers, 2 * shape.LayerElements(), d_len.data(),
                               d_path.data(), kMaxPath, d_path_len.data(),
                               static_cast<int>(batch.size()), tables, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_pool));

    SimulateCommit(shape, batch, kMaxPath, pool);
    pool.resize(pool.size() + kGuard, FromBits(kPoisonBits));
    ExpectPoolEquals(shape, got, pool);
  }
}

// The same launch captured once in a CUDA graph and replayed with new paths written into the
// same device arrays (the engine's step loop): each replay must commit the current paths.
TEST_F(KvOpsTest, KvCommitReplaysInGraph) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr int kMaxPath = 24;
  int num_pages = 0;
  std::vector<CommitSeq> batch = CommitBatch(rng_, kMaxPath, num_pages);
  const PoolShape shape{2, num_pages, 2, 128, 0};
  std::vector<bf16> pool = RandomBits(rng_, shape.Count());
  ASSERT_OK_AND_ASSIGN(auto d_pool, Upload(pool));
  CommitArrays a = Flatten(batch, kMaxPath);
  ASSERT_OK_AND_ASSIGN(auto d_len, Upload(a.committed_len));
  ASSERT_OK_AND_ASSIGN(auto d_path, Upload(a.path));
  ASSERT_OK_AND_ASSIGN(auto d_path_len, Upload(a.path_len));
  ASSERT_OK_AND_ASSIGN(auto d_table, Upload(a.page_table));
  ASSERT_OK_AND_ASSIGN(auto d_offsets, Upload(a.page_offsets));
  const KvLayerView layer0 = shape.Layer0(d_pool.data());

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched =
      LaunchKvCommit(layer0, shape.num_layers, 2 * shape.LayerElements(), d_len.data(),
                     d_path.data(), kMaxPath, d_path_len.data(), static_cast<int>(batch.size()),
                     DevicePageTables{d_table.data(), d_offsets.data()}, stream_);
  const cudaError_t captured = cudaStreamEndCapture(stream_, &graph);
  ASSERT_CUDA(launched);
  ASSERT_CUDA(captured);
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(absl::StrCat("replay ", replay));
    if (replay > 0) {  // new paths over the same tables: the arrays rewritten in place
      for (CommitSeq& s : batch) {
        const int slots = static_cast<int>(s.pages.size()) * kPageSize - s.committed_len;
        if (slots >= 1) s.path = RandomPath(rng_, std::min(slots, 64), kMaxPath);
        s.path_len = static_cast<int>(s.path.size());
      }
      a = Flatten(batch, kMaxPath);
      ASSERT_OK(d_path.CopyFromHost(a.path));
      ASSERT_OK(d_path_len.CopyFromHost(a.path_len));
    }
    SCOPED_TRACE(BatchString(batch));
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_pool));
    SimulateCommit(shape, batch, kMaxPath, pool);
    std::vector<bf16> want = pool;
    want.resize(want.size() + kGuard, FromBits(kPoisonBits));
    ExpectPoolEquals(shape, got, want);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- Launchers reject bad shapes without launching and treat empty batches as a no-op.
TEST_F(KvOpsTest, LaunchersValidateShapes) {
  ASSERT_OK_AND_ASSIGN(auto buf, Poisoned(4096));
  ASSERT_OK_AND_ASSIGN(auto ints, Upload(std::vector<int32_t>(64, 0)));
  ASSERT_OK_AND_ASSIGN(auto inv, Upload(std::vector<float>(64, 1.0f)));
  bf16* p = buf.data();
  const int32_t* i = ints.data();
  KvLayerView layer;
  layer.k = p + 1024;
  layer.v = p + 2048;
  layer.num_pages = 1;
  layer.page_size = 16;
  layer.num_kv_heads = 1;
  layer.head_dim = 8;
  auto write = [&](int rows, int hq, int hkv, int d, const KvLayerView& l) {
    return LaunchKvWrite(p, rows, hq, hkv, d, i, i, inv.data(), 1.0f, nullptr, nullptr, 1e-6f,
                         p + 3072, l, stream_);
  };
  EXPECT_EQ(write(1, 1, 1, 8, layer), cudaSuccess);  // the valid call, reference for the rest
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> after_valid, Download(buf));
  EXPECT_EQ(write(-1, 1, 1, 8, layer), cudaErrorInvalidValue);
  EXPECT_EQ(write(1, 0, 1, 8, layer), cudaErrorInvalidValue);
  EXPECT_EQ(write(1, 1, 2, 8, layer), cudaErrorInvalidValue);  // the layer has 1 KV head
  EXPECT_EQ(write(1, 1, 1, 7, layer), cudaErrorInvalidValue);  // odd head_dim
  KvLayerView bad = layer;
  bad.page_size = 0;
  EXPECT_EQ(write(1, 1, 1, 8, bad), cudaErrorInvalidValue);
  EXPECT_EQ(write(0, 1, 1, 8, layer), cudaSuccess);

  const DevicePageTables tables{i, i};
  auto commit = [&](const KvLayerView& l, int layers, int max_path, int num_seqs) {
    return LaunchKvCommit(l, layers, 1024, i, i, max_path, i, num_seqs, tables, stream_);
  };
  EXPECT_EQ(commit(layer, 0, 4, 1), cudaErrorInvalidValue);
  EXPECT_EQ(commit(layer, 1, 0, 1), cudaErrorInvalidValue);
  EXPECT_EQ(commit(layer, 1, 1025, 1), cudaErrorInvalidValue);
  EXPECT_EQ(commit(layer, 1, 4, -1), cudaErrorInvalidValue);
  EXPECT_EQ(commit(layer, 1, 4, 65536), cudaErrorInvalidValue);
  EXPECT_EQ(commit(bad, 1, 4, 1), cudaErrorInvalidValue);
  bad = layer;
  bad.head_dim = 0;
  EXPECT_EQ(commit(bad, 1, 4, 1), cudaErrorInvalidValue);
  EXPECT_EQ(commit(layer, 1, 4, 0), cudaSuccess);
  EXPECT_EQ(commit(layer, 1, 4, 1), cudaSuccess);  // path_len 0: runs, writes nothing
  // Nothing after the valid write may have changed the buffer.
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(buf));
  for (size_t e = 0; e < got.size(); ++e) ASSERT_EQ(Bits(got[e]), Bits(after_valid[e])) << e;
}

}  // namespace
}  // namespace treespec::gpu
