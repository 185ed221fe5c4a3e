// Tree attention on the GPU against the CPU reference (common/model/tree_attention.h), DESIGN
// §8: fresh random K/V/Q rounded to bf16 (the CPU gets the same values), a poisoned output,
// random page tables, batches mixing contexts and tree shapes (1, 3, 17, 64, 255 nodes, odd
// contexts), chains through the implicit causal mask, split and unsplit key ranges (split tiles
// merged by the merge launch or by their last CTA), GQA groups that straddle a rank's first
// head. Skips without a GPU.
//
// Tolerance, per element: the kernel rounds the probabilities to bf16 before P·V (relative
// error <= 2^-9 each) but normalises by the fp32 sum, so |got - ref| <= 2^-8 |ref| (output
// rounding) + 2^-9 Σp|v| (<= 2^-9 max|v|) + the fp32 and ex2.approx terms (~2^-20);
// scores are exact products of bf16 values summed in fp32. The test allows 2^-8 max|v|.
// On top, the error over all outputs must stay under 1 % RMS of the reference.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/testing/delayed_copy.h"
#include "common/cuda/tree_attention.h"
#include "common/model/kv_cache.h"
#include "common/model/tree_attention.h"
#include "common/tree/token_tree.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding

struct SeqSpec {
  int prefix_len;
  int num_nodes;
  int first_query = 0;
  bool chain = false;     // parents[i] = i - 1
  bool implicit = false;  // chain given to the GPU as "no mask" (causal path)
};

struct Shape {
  int num_q_heads, num_kv_heads, group_size, q_head_shift, head_dim, page_size;
};

class TreeAttentionTest : public CudaTest {
 protected:
  // Runs the batch on the GPU and on the CPU and compares.
  // late_writer: q and the tree nodes' K/V start poisoned on the GPU and are written by a kernel
  // that lets the attention launch at once but writes only after 200 µs (the attention is a
  // programmatic dependent of it, as of the RoPE + K/V write kernel in the model).
  void Check(const Shape& shape, const std::vector<SeqSpec>& specs, int min_split_tiles,
             float q_scale = 1.0f, bool late_writer = false) {
    SCOPED_TRACE(absl::StrCat("seed ", Seed(), " heads ", shape.num_q_heads, "/",
                              shape.num_kv_heads, " d ", shape.head_dim, " page ", shape.page_size,
                              " min_split_tiles ", min_split_tiles));
    const int d = shape.head_dim;
    // Pages: enough for every sequence plus spares, handed out in a shuffled order.
    std::vector<std::vector<int32_t>> pages(specs.size());
    int total_pages = 3;
    for (const SeqSpec& s : specs) {
      total_pages += (s.prefix_len + s.num_nodes + shape.page_size - 1) / shape.page_size + 1;
    }
    std::vector<int32_t> order(total_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    int next = 0;
    for (size_t b = 0; b < specs.size(); ++b) {
      const int need =
          (specs[b].prefix_len + specs[b].num_nodes + shape.page_size - 1) / shape.page_size +
          (b % 2);  // sometimes one page more than needed
      for (int p = 0; p < need; ++p) pages[b].push_back(order[next++]);
    }

    // K/V: random bf16 everywhere (pages not in any table too), the same values on both sides.
    KvPool cpu_pool(1, total_pages, shape.page_size, shape.num_kv_heads, d);
    ASSERT_OK_AND_ASSIGN(auto gpu_pool, DeviceKvPool::Create(1, total_pages, shape.page_size,
                                                             shape.num_kv_heads, d));
    const KvLayerView layer = gpu_pool.Layer(0);
    const size_t pool_elems =
        static_cast<size_t>(total_pages) * shape.page_size * shape.num_kv_heads * d;
    const Bf16Data k = RandomBf16(rng_, pool_elems, 1.0f);
    const Bf16Data v = RandomBf16(rng_, pool_elems, 1.0f);
    std::vector<bf16> k_gpu(pool_elems), v_gpu(pool_elems);
    size_t i = 0;
    for (int page = 0; page < total_pages; ++page) {
      for (int off = 0; off < shape.page_size; ++off) {
        for (int h = 0; h < shape.num_kv_heads; ++h) {
          const int64_t dst = layer.Offset(page, h, off);
          for (int e = 0; e < d; ++e, ++i) {
            cpu_pool.K(0, page, off)[h * d + e] = k.f[i];
            cpu_pool.V(0, page, off)[h * d + e] = v.f[i];
            k_gpu[dst + e] = k.bf[i];
            v_gpu[dst + e] = v.bf[i];
          }
        }
      }
    }
    // late_writer: the pool the attention starts from has every tree slot poisoned.
    std::vector<int32_t> kv_slots;
    if (late_writer) {
      for (size_t b = 0; b < specs.size(); ++b) {
        for (int n = 0; n < specs[b].num_nodes; ++n) {
          const int slot = specs[b].prefix_len + n;
          const int page = pages[b][slot / shape.page_size], off = slot % shape.page_size;
          kv_slots.push_back(page * shape.page_size + off);
        }
      }
    }
    std::vector<bf16> k_live = k_gpu, v_live = v_gpu;
    auto poison = [&](int page, int off) {
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        const int64_t at = layer.Offset(page, h, off);
        std::fill_n(k_live.begin() + at, d, FromBits(kPoisonBits));
        std::fill_n(v_live.begin() + at, d, FromBits(kPoisonBits));
      }
    };
    for (const int32_t slot : kv_slots) poison(slot / shape.page_size, slot % shape.page_size);
    // Slots no sequence uses (past each one's last node, and pages in no table) hold NaN on the
    // GPU: the kernel must neither read them into a visible score nor multiply them by P = 0.
    std::vector<bool> in_table(total_pages, false);
    for (size_t b = 0; b < specs.size(); ++b) {
      const int used = specs[b].prefix_len + specs[b].num_nodes;
      for (size_t p = 0; p < pages[b].size(); ++p) {
        in_table[pages[b][p]] = true;
        for (int off = std::max(0, used - static_cast<int>(p) * shape.page_size);
             off < shape.page_size; ++off) {
          poison(pages[b][p], off);
        }
      }
    }
    for (int page = 0; page < total_pages; ++page) {
      for (int off = 0; !in_table[page] && off < shape.page_size; ++off) poison(page, off);
    }
    ASSERT_CUDA(cudaMemcpy(layer.k, k_live.data(), pool_elems * 2, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(layer.v, v_live.data(), pool_elems * 2, cudaMemcpyHostToDevice));

    // Trees: random parents (parents precede children), or chains.
    std::vector<std::vector<uint64_t>> masks(specs.size());
    std::vector<AttnSeqDesc> descs(specs.size());
    int rows = 0;
    for (size_t b = 0; b < specs.size(); ++b) {
      const SeqSpec& s = specs[b];
      std::vector<int32_t> parents(s.num_nodes, -1);
      for (int n = 1; n < s.num_nodes; ++n) {
        parents[n] = s.chain ? n - 1 : std::uniform_int_distribution<int>(0, n - 1)(rng_);
      }
      masks[b] = AncestorMask(parents);
      descs[b].pages = pages[b];
      descs[b].prefix_len = s.prefix_len;
      descs[b].num_nodes = s.num_nodes;
      descs[b].first_query = s.first_query;
      if (!s.implicit) descs[b].ancestor_mask = masks[b];
      rows += s.num_nodes - s.first_query;
    }
    const size_t row_elems = static_cast<size_t>(shape.num_q_heads) * d;
    const Bf16Data q = RandomBf16(rng_, rows * row_elems, q_scale);

    // CPU reference, sequence by sequence.
    std::vector<int> kv_head_of_q(shape.num_q_heads);
    for (int h = 0; h < shape.num_q_heads; ++h) {
      kv_head_of_q[h] = (h + shape.q_head_shift) / shape.group_size;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> want(rows * row_elems);
    TreeAttentionScratch scratch;
    int row = 0;
    for (size_t b = 0; b < specs.size(); ++b) {
      TreeAttentionSeq seq;
      seq.pages = pages[b];
      seq.prefix_len = specs[b].prefix_len;
      seq.num_nodes = specs[b].num_nodes;
      seq.first_query = specs[b].first_query;
      seq.ancestor_mask = masks[b];
      ::treespec::TreeAttention(cpu_pool, 0, shape.page_size, seq, {kv_head_of_q, d, d}, scale,
                                q.f.data() + row * row_elems, want.data() + row * row_elems,
                                &scratch);
      row += specs[b].num_nodes - specs[b].first_query;
    }

    // GPU, with each query tile size (the CPU result is the same for both), the mma.sync and
    // (on compute capability 9.0, head dims 64 and 128) the wgmma path, and split tiles merged by
    // the merge launch only, by their last CTA when small (the default), or by their last CTA
    // whenever its shared memory holds the partial rows.
    int major = 0;
    ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    for (int tile_rows : {kAttnSmallTileRows, kAttnMaxTileRows}) {
      for (bool wgmma : {false, true}) {
        for (int fused : {0, TreeAttentionOptions{}.fused_merge_row_splits, 1 << 30}) {
          SCOPED_TRACE(absl::StrCat("tiles of ", tile_rows, " rows, wgmma ", wgmma,
                                    ", fused merges up to ", fused, " row-splits"));
          TreeAttentionOptions options;
          options.heads = {shape.num_q_heads, shape.num_kv_heads, shape.group_size,
                           shape.q_head_shift};
          options.head_dim = d;
          options.page_size = shape.page_size;
          options.pool_pages = total_pages;
          options.scale = scale;
          options.limits = {64, 4096, 65536, 16384, 16384};
          options.min_split_tiles = min_split_tiles;
          options.tile_rows = tile_rows;
          options.fused_merge_row_splits = fused;
          options.wgmma = wgmma;
          ASSERT_OK_AND_ASSIGN(auto attention, gpu::TreeAttention::Create(options));
          ASSERT_EQ(attention->uses_wgmma(), wgmma && major == 9 && d != 32);
          ASSERT_OK(attention->Prepare(descs, stream_));
          ASSERT_EQ(attention->plan().num_query_rows, rows);
          ASSERT_EQ(attention->plan().tile_rows, tile_rows);
          ASSERT_OK_AND_ASSIGN(auto d_q, late_writer ? Poisoned(q.bf.size()) : Upload(q.bf));
          ASSERT_OK_AND_ASSIGN(auto d_out, Poisoned(rows * row_elems));
          // What the late writer copies in: q and the pools with their tree slots.
          ASSERT_OK_AND_ASSIGN(auto d_q_final, Upload(q.bf));
          ASSERT_OK_AND_ASSIGN(auto d_k_final, Upload(k_gpu));
          ASSERT_OK_AND_ASSIGN(auto d_v_final, Upload(v_gpu));
          auto run = [&] {
            if (late_writer) {  // poisoned q and tree slots, then the writer, then attention
              ASSERT_CUDA(
                  cudaMemcpy(layer.k, k_live.data(), pool_elems * 2, cudaMemcpyHostToDevice));
              ASSERT_CUDA(
                  cudaMemcpy(layer.v, v_live.data(), pool_elems * 2, cudaMemcpyHostToDevice));
              ASSERT_CUDA(cudaMemset(d_q.data(), 0xFF, q.bf.size() * sizeof(bf16)));
              const CopyRange ranges[] = {{d_q.data(), d_q_final.data(), q.bf.size() * 2},
                                          {layer.k, d_k_final.data(), pool_elems * 2},
                                          {layer.v, d_v_final.data(), pool_elems * 2}};
              ASSERT_CUDA(LaunchDelayedCopy(ranges, /*delay_us=*/200, stream_));
            }
            ASSERT_CUDA(attention->Run(layer, d_q.data(), d_out.data(), stream_));
          };
          run();
          ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_out));
          ExpectGuardIntact(got, rows * row_elems);

          // A second launch into a poisoned output must give the same bits (the last-CTA merge
          // counters were re-armed).
          ASSERT_CUDA(cudaMemset(d_out.data(), 0xFF, rows * row_elems * sizeof(bf16)));
          run();
          ASSERT_OK_AND_ASSIGN(const std::vector<bf16> again, Download(d_out));

          double err2 = 0, ref2 = 0;
          int bad = 0;
          for (size_t e = 0; e < rows * row_elems; ++e) {
            const float g = ToFloat(got[e]);
            const double tol = kBf16U * std::fabs(want[e]) + kBf16U * 1.0 + 1e-6;
            ASSERT_EQ(Bits(got[e]), Bits(again[e]))
                << "element " << e << " differs between launches";
            if (!(std::fabs(g - want[e]) <= tol) && bad++ < 5) {
              ADD_FAILURE() << "row " << e / row_elems << " head " << (e % row_elems) / d << " dim "
                            << e % d << ": got " << g << " want " << want[e];
            }
            err2 += (g - want[e]) * (g - want[e]);
            ref2 += static_cast<double>(want[e]) * want[e];
          }
          EXPECT_EQ(bad, 0);
          EXPECT_LE(std::sqrt(err2 / ref2), 1e-2) << "RMS relative error";
          EXPECT_GT(ref2, 0.0);
        }
      }
    }
  }
};

constexpr Shape kLlama8B{32, 8, 4, 0, 128, 16};

TEST_F(TreeAttentionTest, TreesOfEverySizeMatchCpu) {
  for (int n : {1, 3, 17, 64, 255}) {
    SCOPED_TRACE(absl::StrCat("nodes ", n));
    Check(kLlama8B, {{0, n}, {37, n}, {1000 + 3, n}}, /*min_split_tiles=*/1);
  }
}

TEST_F(TreeAttentionTest, MixedBatchSplitAndUnsplit) {
  const std::vector<SeqSpec> batch = {{4099, 17},  {0, 1},   {1, 64}, {513, 3},
                                      {2048, 255}, {15, 16}, {16, 1}, {777, 33}};
  Check(kLlama8B, batch, /*min_split_tiles=*/1);
  Check(kLlama8B, batch, /*min_split_tiles=*/1000);  // every tile in one CTA
}

TEST_F(TreeAttentionTest, PeakySoftmaxCatchesEveryMaskedKey) {
  // Large queries make the softmax concentrate on few keys, so one wrongly visible or hidden
  // key moves the output by far more than the tolerance.
  Check(kLlama8B, {{0, 255}, {5, 64}, {64, 17}}, 1, /*q_scale=*/8.0f);
}

TEST_F(TreeAttentionTest, ChainsThroughTheCausalPathEqualChainMasks) {
  // Same chains, once with an explicit mask and once through the implicit causal mask: both
  // against the CPU (whose chain mask is plain causal attention). Prefill is a chain from 0.
  Check(kLlama8B, {{0, 300, 0, true, true}, {100, 17, 0, true, true}, {3, 64, 0, true, false}}, 1);
  Check(kLlama8B, {{0, 300, 0, true, true}}, 1000, /*q_scale=*/8.0f);
}

TEST_F(TreeAttentionTest, FirstQueryLimitsTheQueries) {
  Check(kLlama8B, {{50, 40, 25}, {0, 255, 200, true, true}, {9, 3, 2}}, 1);
}

TEST_F(TreeAttentionTest, OtherHeadDimsPagesAndGqa) {
  // tiny pair (d 32, 8 q / 4 kv), d 64 with 32-slot pages, Qwen2-7B-like 28/4, MHA, a TP
  // slice whose first q head sits in the middle of a GQA group (5 local q heads, group 4,
  // shift 2: heads 0-1 read kv 0, heads 2-4 read kv 1), and pages longer than a 64-key stage.
  for (const Shape& shape :
       {Shape{8, 4, 2, 0, 32, 16}, Shape{16, 2, 8, 0, 64, 32}, Shape{28, 4, 7, 0, 128, 16},
        Shape{4, 4, 1, 0, 64, 16}, Shape{5, 2, 4, 2, 128, 16}, Shape{32, 8, 4, 0, 128, 128}}) {
    Check(shape, {{0, 17}, {300, 64}, {1, 3}, {130, 255}}, 1);
  }
}

TEST_F(TreeAttentionTest, DependentLaunchWaitsForTheWriterOfQAndTreeSlots) {
  // q and the trees' K/V come from the kernel launched just before, 200 µs after the attention
  // may start; the first key tile of a split is requested before griddepcontrol.wait only when
  // it lies in the committed prefix. Short prefixes (the first tile reaches the tree), long
  // ones, a query range that starts inside the tree, both tile sizes. (On an H200, a kernel that
  // takes every first tile early fails this test.)
  Check(kLlama8B, {{0, 17}, {40, 3}, {1000 + 3, 17}, {4096, 64}, {64, 1}, {130, 20, 5}}, 1, 1.0f,
        true);
}

TEST_F(TreeAttentionTest, BadBatchesAreRefusedWithAReason) {
  TreeAttentionOptions options;
  options.heads = {32, 8, 4, 0};
  options.head_dim = 128;
  options.pool_pages = 8;
  options.scale = 0.1f;
  options.limits = {4, 64, 64, 256, 256};
  ASSERT_OK_AND_ASSIGN(auto attention, gpu::TreeAttention::Create(options));
  const std::vector<int32_t> pages = {0, 1};
  AttnSeqDesc seq;
  seq.pages = pages;
  seq.prefix_len = 30;
  seq.num_nodes = 3;  // 33 slots > 2 pages of 16
  absl::Status status = attention->Prepare({seq}, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("cannot hold 33 slots"), std::string::npos) << status;

  options.head_dim = 96;
  EXPECT_EQ(gpu::TreeAttention::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A page of every KV head must fit the kernel's 32-bit byte offsets: 8 heads × 2^20 slots × 128
  // × 2 bytes is 2 GiB.
  options.head_dim = 128;
  options.page_size = 1 << 20;
  status = gpu::TreeAttention::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("use smaller pages"), std::string::npos) << status;
}

}  // namespace
}  // namespace treespec::gpu
