// The tree-attention work partitioning (host only; runs on any machine): every query row of
// every (sequence, KV head) is covered by exactly one tile, every tile's key range
// [0, L + last node + 1) by its splits exactly once, in order; the batch is spread over about
// target_ctas CTAs; every row of a split tile is merged once, by the tile's last CTA (small tiles,
// when asked) or by one merge CTA; malformed batches are refused with a message naming the field.
#include "common/cuda/tree_attention_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tree/token_tree.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {

constexpr AttnPlanLimits kLimits{64, 1 << 16, 1 << 16, 1 << 16, 1 << 16};

AttnSplitOptions Split(int target_ctas, int min_split_tiles = 1, int tile_rows = kAttnSmallTileRows,
                       int fused_merge_row_splits = 0, bool proportional_splits = true) {
  AttnSplitOptions split;
  split.proportional_splits = proportional_splits;
  split.target_ctas = target_ctas;
  split.min_split_tiles = min_split_tiles;
  split.tile_rows = tile_rows;
  split.fused_merge_row_splits = fused_merge_row_splits;
  return split;
}

struct Batch {
  std::vector<std::vector<int32_t>> pages;
  std::vector<std::vector<uint64_t>> masks;
  std::vector<AttnSeqDesc> descs;
};

Batch MakeBatch(const std::vector<std::tuple<int, int, int>>& shapes, int page_size,
                std::mt19937& rng) {
  Batch batch;
  batch.pages.resize(shapes.size());
  batch.masks.resize(shapes.size());
  int next_page = 0;
  for (size_t b = 0; b < shapes.size(); ++b) {
    const auto [prefix, nodes, first] = shapes[b];
    for (int p = 0; p < (prefix + nodes + page_size - 1) / page_size; ++p) {
      batch.pages[b].push_back(next_page++);
    }
    std::vector<int32_t> parents(nodes, -1);
    for (int i = 1; i < nodes; ++i) parents[i] = std::uniform_int_distribution<int>(0, i - 1)(rng);
    batch.masks[b] = AncestorMask(parents);
  }
  for (size_t b = 0; b < shapes.size(); ++b) {
    AttnSeqDesc d;
    d.pages = batch.pages[b];
    d.prefix_len = std::get<0>(shapes[b]);
    d.num_nodes = std::get<1>(shapes[b]);
    d.first_query = std::get<2>(shapes[b]);
    d.ancestor_mask = batch.masks[b];
    batch.descs.push_back(d);
  }
  return batch;
}

TEST(TreeAttentionPlanTest, HeadsMapOntoKvHeads) {
  const AttnHeads llama{32, 8, 4, 0};
  EXPECT_EQ(llama.FirstQHead(3), 12);
  EXPECT_EQ(llama.NumQHeads(3), 4);
  // A TP slice of 5 q heads starting at the third head of a group: 2 + 3.
  const AttnHeads slice{5, 2, 4, 2};
  EXPECT_EQ(slice.FirstQHead(0), 0);
  EXPECT_EQ(slice.NumQHeads(0), 2);
  EXPECT_EQ(slice.FirstQHead(1), 2);
  EXPECT_EQ(slice.NumQHeads(1), 3);
}

TEST(TreeAttentionPlanTest, TilesAndSplitsCoverEveryRowAndKeyOnce) {
  std::mt19937 rng(7);
  const Batch batch = MakeBatch(
      {{0, 1, 0}, {4099, 17, 0}, {1, 255, 0}, {100, 64, 40}, {32768, 16, 0}, {0, 300, 299}}, 16,
      rng);
  const AttnHeads heads{5, 2, 4, 2};
  for (int tile : {kAttnSmallTileRows, kAttnMaxTileRows}) {
    for (int target : {1, 7, 132, 264, 100000}) {
      for (int fused : {0, 256, 1 << 30}) {
        for (bool proportional : {true, false}) {
          SCOPED_TRACE(absl::StrCat("target_ctas ", target, ", tiles of ", tile, " rows, fused ",
                                    fused, proportional ? ", proportional" : ", whole chunks"));
          auto plan = PlanTreeAttention(batch.descs, heads, 16, 1 << 20, kLimits,
                                        Split(target, 1, tile, fused, proportional));
          ASSERT_TRUE(plan.ok()) << plan.status();
          EXPECT_EQ(plan->tile_rows, tile);
          // rows[(seq, kv head)] -> tile starts; keys[(seq, head, row_begin)] -> next expected key.
          std::map<std::tuple<int, int, int>, int> next_key;
          std::map<std::tuple<int, int, int>, int> splits_seen;
          std::map<std::tuple<int, int, int>, int> counter_of;  // split tile -> its merge counter
          int partials = 0;
          for (const AttnWorkItem& item : plan->items) {
            const auto key = std::make_tuple(item.seq, item.kv_head, item.row_begin);
            EXPECT_EQ(item.key_begin, next_key[key]) << "gap or overlap in the key range";
            EXPECT_LT(item.key_begin, item.key_end);
            EXPECT_EQ(item.key_begin % kAttnTileKeys, 0);
            next_key[key] = item.key_end;
            EXPECT_EQ(item.page_begin, plan->seqs[item.seq].page_begin);
            EXPECT_EQ(item.prefix_len, plan->seqs[item.seq].prefix_len);
            EXPECT_EQ(item.split, splits_seen[key]++);
            if (item.num_splits > 1) {
              EXPECT_GE(item.partial_base, 0);
              partials = std::max(partials, item.partial_base + item.split + 1);
              // Every split of a tile names the same counter (or none).
              if (item.split == 0) counter_of[key] = item.merge_counter;
              EXPECT_EQ(item.merge_counter, counter_of[key]);
            } else {
              EXPECT_EQ(item.partial_base, -1);
              EXPECT_EQ(item.merge_counter, -1);
            }
          }
          EXPECT_EQ(partials, plan->num_partials);
          // Fused tiles: every split tile when all have valid rows × splits <= fused, else none;
          // one counter each, numbered from 0.
          bool all_fusable = true;
          for (const auto& [key, counter] : counter_of) {
            const auto [b, h, r0] = key;
            const AttnSeqDesc& s = batch.descs[b];
            const int valid =
                std::min(tile, (s.num_nodes - s.first_query) * heads.NumQHeads(h) - r0);
            all_fusable = all_fusable && static_cast<int64_t>(valid) * splits_seen[key] <= fused;
          }
          std::vector<int> counter_uses(plan->num_fused_tiles, 0);
          for (const auto& [key, counter] : counter_of) {
            const auto [b, h, r0] = key;
            EXPECT_EQ(counter >= 0, all_fusable)
                << "seq " << b << " head " << h << " rows from " << r0;
            if (counter >= 0) {
              ASSERT_LT(counter, plan->num_fused_tiles);
              ++counter_uses[counter];
            }
          }
          for (int uses : counter_uses) EXPECT_EQ(uses, 1);
          if (fused == 0) EXPECT_EQ(plan->num_fused_tiles, 0);
          if (fused == 1 << 30) EXPECT_TRUE(plan->merges.empty());
          int rows = 0;
          for (size_t b = 0; b < batch.descs.size(); ++b) {
            const AttnSeqDesc& s = batch.descs[b];
            rows += s.num_nodes - s.first_query;
            EXPECT_EQ(plan->seqs[b].q_row_begin, rows - (s.num_nodes - s.first_query));
            for (int h = 0; h < heads.num_kv_heads; ++h) {
              const int tile_rows = (s.num_nodes - s.first_query) * heads.NumQHeads(h);
              for (int r = 0; r < tile_rows; r += tile) {
                const auto key = std::make_tuple(static_cast<int>(b), h, r);
                const int last_node =
                    s.first_query + (std::min(tile_rows, r + tile) - 1) / heads.NumQHeads(h);
                EXPECT_EQ(next_key[key], s.prefix_len + last_node + 1)
                    << "seq " << b << " head " << h << " rows from " << r;
                EXPECT_EQ(
                    splits_seen[key], plan->items.empty() ? 0 : [&] {
                      for (const AttnWorkItem& item : plan->items) {
                        if (std::make_tuple(item.seq, item.kv_head, item.row_begin) == key) {
                          return item.num_splits;
                        }
                      }
                      return -1;
                    }());
              }
            }
          }
          EXPECT_EQ(plan->num_query_rows, rows);
          // Merge CTAs: every row of every split tile that is not fused exactly once, none for
          // unsplit or fused tiles.
          std::map<std::tuple<int, int, int>, int> merged;  // (seq, head, row) -> times merged
          for (const AttnMergeItem& m : plan->merges) {
            const auto tile_key = std::make_tuple(m.seq, m.kv_head, m.tile_row_begin);
            ASSERT_GT(splits_seen[tile_key], 1) << "merge of an unsplit tile";
            EXPECT_EQ(counter_of[tile_key], -1) << "merge of a fused tile";
            EXPECT_EQ(m.num_splits, splits_seen[tile_key]);
            const auto first =
                std::find_if(plan->items.begin(), plan->items.end(), [&](auto& item) {
                  return std::make_tuple(item.seq, item.kv_head, item.row_begin) == tile_key;
                });
            EXPECT_EQ(m.partial_base, first->partial_base);
            EXPECT_EQ(m.q_row_begin, plan->seqs[m.seq].q_row_begin);
            EXPECT_GE(m.row_begin, m.tile_row_begin);
            EXPECT_LE(m.row_begin + m.rows, m.tile_row_begin + tile);
            EXPECT_GE(m.rows, 1);
            EXPECT_LE(m.rows, AttnMergeRows(tile, m.num_splits));
            for (int r = m.row_begin; r < m.row_begin + m.rows; ++r) {
              ++merged[std::make_tuple(m.seq, m.kv_head, r)];
            }
          }
          int split_rows = 0;
          for (const auto& [key, splits] : splits_seen) {
            if (splits < 2 || counter_of[key] >= 0) continue;
            const auto [b, h, r0] = key;
            const AttnSeqDesc& s = batch.descs[b];
            const int end = std::min(r0 + tile, (s.num_nodes - s.first_query) * heads.NumQHeads(h));
            for (int r = r0; r < end; ++r) {
              EXPECT_EQ(merged[std::make_tuple(b, h, r)], 1)
                  << "seq " << b << " head " << h << " row " << r;
            }
            split_rows += end - r0;
          }
          EXPECT_EQ(static_cast<int>(merged.size()), split_rows) << "rows merged that no tile has";
          EXPECT_LE(plan->merges.size(), 2 * plan->items.size());
          if (target == 132 || target == 264) {  // (fewer key tiles than 100000 CTAs)
            // Enough splitting to fill the GPU, not wildly more than asked.
            EXPECT_GE(static_cast<int>(plan->items.size()), target / 2);
            EXPECT_LE(static_cast<int>(plan->items.size()), 2 * target + 64);
          }
          if (target == 1) EXPECT_EQ(plan->num_partials, 0) << "one CTA per tile needs no merge";
        }
      }
    }
  }
}

TEST(TreeAttentionPlanTest, LastCtaMergesOnlyWhenNoTileNeedsTheMergeLaunch) {
  std::mt19937 rng(13);
  const AttnHeads llama{32, 8, 4, 0};
  // One node at 1k: 4 rows × 17 splits = 68 <= 80, merged by the last CTA. Beside a 16-node
  // tree (64 rows × 17 splits), which needs the merge launch, it goes there too.
  const Batch one = MakeBatch({{1024, 1, 0}}, 16, rng);
  const Batch mixed = MakeBatch({{1024, 1, 0}, {1024, 16, 0}}, 16, rng);
  auto alone = PlanTreeAttention(one.descs, llama, 16, 1 << 20, kLimits,
                                 Split(264, 1, kAttnSmallTileRows, 80));
  auto beside = PlanTreeAttention(mixed.descs, llama, 16, 1 << 20, kLimits,
                                  Split(264, 1, kAttnSmallTileRows, 80));
  ASSERT_TRUE(alone.ok() && beside.ok()) << alone.status() << beside.status();
  EXPECT_EQ(alone->num_split_tiles, 8);
  EXPECT_EQ(alone->num_fused_tiles, 8);
  EXPECT_TRUE(alone->merges.empty());
  EXPECT_EQ(beside->num_split_tiles, 16);
  EXPECT_EQ(beside->num_fused_tiles, 0);
  for (const AttnWorkItem& item : beside->items) EXPECT_EQ(item.merge_counter, -1);
  int merged_rows = 0;
  for (const AttnMergeItem& m : beside->merges) merged_rows += m.rows;
  EXPECT_EQ(merged_rows, 8 * (4 + 64));
}

TEST(TreeAttentionPlanTest, ProportionalSplitsFillTheTarget) {
  std::mt19937 rng(11);
  const AttnHeads llama{32, 8, 4, 0};
  // A 64-node tree at 1k: 4 row tiles × 8 KV heads, 17 key tiles each (544 in all). Whole
  // chunks of ceil(544 / 264) = 3 key tiles give 5 splits a tile (160 CTAs); proportional
  // splits give floor(17 × 264 / 544) = 8 (256).
  const Batch tree = MakeBatch({{1024, 64, 0}}, 16, rng);
  auto whole = PlanTreeAttention(tree.descs, llama, 16, 1 << 20, kLimits,
                                 Split(264, 1, kAttnSmallTileRows, 0, false));
  auto prop = PlanTreeAttention(tree.descs, llama, 16, 1 << 20, kLimits, Split(264));
  ASSERT_TRUE(whole.ok() && prop.ok()) << whole.status() << prop.status();
  EXPECT_EQ(whole->items.size(), 160u);
  EXPECT_EQ(prop->items.size(), 256u);
  for (const AttnWorkItem& item : prop->items) EXPECT_EQ(item.num_splits, 8);
  // Tiles of different lengths (56 tiles, 4.7k key tiles): at most target CTAs, and fewer than
  // one CTA a tile below it, for targets where every tile's share is at least one split and
  // below kAttnMaxSplits.
  const Batch mixed = MakeBatch({{4099, 17, 0}, {1500, 3, 0}, {9000, 40, 0}, {700, 1, 0}}, 16, rng);
  for (int target : {264, 1000, 2000}) {
    auto plan = PlanTreeAttention(mixed.descs, llama, 16, 1 << 20, kLimits, Split(target));
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::set<std::tuple<int, int, int>> tiles;
    for (const AttnWorkItem& item : plan->items) {
      tiles.insert({item.seq, item.kv_head, item.row_begin});
    }
    EXPECT_LE(plan->items.size(), static_cast<size_t>(target)) << "target " << target;
    EXPECT_GE(plan->items.size() + tiles.size(), static_cast<size_t>(target))
        << "target " << target;
  }
}

TEST(TreeAttentionPlanTest, OneCtaPerSmWhenSplittingSomeTilesWouldLengthenTheLaunch) {
  std::mt19937 rng(13);
  const AttnHeads llama{32, 8, 4, 0};
  auto plan_of = [&](const Batch& batch, int sms) {
    AttnSplitOptions split = Split(264);
    split.sms = sms;
    auto plan = PlanTreeAttention(batch.descs, llama, 16, 1 << 20, kLimits, split);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : AttnPlan{};
  };
  // 256 nodes at 1k: 16 row tiles × 8 KV heads of 17–20 key tiles. Filling 264 slots splits the
  // 96 tiles of 18–20 key tiles in two (224 CTAs, a merge) while the 17-tile ones stay whole
  // beside them: 17 × 1.44 + 6 against 20 alone, so one CTA per SM, no split.
  const Batch wide = MakeBatch({{1024, 256, 0}}, 16, rng);
  const AttnPlan full = plan_of(wide, 0);
  EXPECT_EQ(full.items.size(), 224u);
  EXPECT_EQ(full.num_split_tiles, 96);
  const AttnPlan per_sm = plan_of(wide, 132);
  EXPECT_EQ(per_sm.items.size(), 128u);
  EXPECT_EQ(per_sm.num_split_tiles, 0);
  EXPECT_TRUE(per_sm.merges.empty());
  // At 4k every tile splits in two (34 × 1.44 + 6 against 68): the full target stays.
  const AttnPlan longer = plan_of(MakeBatch({{4096, 256, 0}}, 16, rng), 132);
  EXPECT_EQ(longer.items.size(), 256u);
  // Few tiles (64 nodes at 1k: 32 tiles split 8 ways, 3 key tiles each): the full target stays.
  const AttnPlan few = plan_of(MakeBatch({{1024, 64, 0}}, 16, rng), 132);
  EXPECT_EQ(few.items.size(), 256u);
  // One CTA per SM already (the 128-row tiles' target): the same plan with or without sms.
  AttnSplitOptions large = Split(132, 1, kAttnMaxTileRows);
  auto without = PlanTreeAttention(wide.descs, llama, 16, 1 << 20, kLimits, large);
  large.sms = 132;
  auto with = PlanTreeAttention(wide.descs, llama, 16, 1 << 20, kLimits, large);
  ASSERT_TRUE(without.ok() && with.ok()) << without.status() << with.status();
  EXPECT_GT(with->items.size(), 64u);  // its 18–20-tile tiles split
  EXPECT_EQ(with->items.size(), without->items.size());
}

TEST(TreeAttentionPlanTest, AutoTileRowsKeepsATreeOfAGqaGroupInOneTile) {
  std::mt19937 rng(9);
  const AttnHeads llama{32, 8, 4, 0};
  // 16 nodes × 4 q heads = 64 rows fit a small tile; 17 nodes (16 drafted + root) need 68.
  EXPECT_EQ(AutoTileRows(MakeBatch({{1000, 16, 0}, {50, 3, 0}}, 16, rng).descs, llama),
            kAttnSmallTileRows);
  EXPECT_EQ(AutoTileRows(MakeBatch({{1000, 16, 0}, {50, 17, 0}}, 16, rng).descs, llama),
            kAttnMaxTileRows);
  // Only query nodes count: 20 nodes of which the last 16 are queries.
  EXPECT_EQ(AutoTileRows(MakeBatch({{0, 20, 4}}, 16, rng).descs, llama), kAttnSmallTileRows);
  // Uneven TP slices: the largest group decides (3 q heads × 22 nodes = 66 rows).
  EXPECT_EQ(AutoTileRows(MakeBatch({{10, 22, 0}}, 16, rng).descs, AttnHeads{5, 2, 4, 2}),
            kAttnMaxTileRows);
  EXPECT_EQ(AutoTileRows({}, llama), kAttnSmallTileRows);
  // The wgmma path: 128 rows only while one tile holds them all (17–32 nodes × 4 heads).
  const Batch mid = MakeBatch({{1000, 32, 0}, {50, 3, 0}}, 16, rng);
  const Batch big = MakeBatch({{1000, 33, 0}, {50, 3, 0}}, 16, rng);
  EXPECT_EQ(AutoTileRows(mid.descs, llama, /*wgmma=*/true), kAttnMaxTileRows);
  EXPECT_EQ(AutoTileRows(big.descs, llama, /*wgmma=*/true), kAttnSmallTileRows);
  EXPECT_EQ(AutoTileRows(big.descs, llama, /*wgmma=*/false), kAttnMaxTileRows);
  EXPECT_EQ(AutoTileRows(MakeBatch({{1000, 16, 0}}, 16, rng).descs, llama, true),
            kAttnSmallTileRows);
  auto bad = PlanTreeAttention({}, llama, 16, 100, kLimits, Split(10, 1, 96));
  EXPECT_NE(bad.status().message().find("tile_rows 96"), std::string::npos) << bad.status();
}

TEST(TreeAttentionPlanTest, MinSplitTilesBoundsTheSplits) {
  std::mt19937 rng(3);
  const Batch batch = MakeBatch({{8192, 16, 0}}, 16, rng);
  auto plan = PlanTreeAttention(batch.descs, {32, 8, 4, 0}, 16, 1 << 20, kLimits,
                                Split(100000, /*min_split_tiles=*/8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const AttnWorkItem& item : plan->items) {
    EXPECT_GE(item.key_end - item.key_begin,
              std::min(8 * kAttnTileKeys, 8192 + 16 - item.key_begin));
  }
}

TEST(TreeAttentionPlanTest, FewPartialSlotsMeanLongerSplits) {
  std::mt19937 rng(5);
  const Batch batch = MakeBatch({{32768, 16, 0}, {8192, 64, 0}}, 16, rng);
  AttnPlanLimits limits = kLimits;
  limits.max_partials = 40;
  auto plan = PlanTreeAttention(batch.descs, {32, 8, 4, 0}, 16, 1 << 20, limits, Split(264));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->num_partials, 40);
  EXPECT_GT(plan->num_partials, 0);
}

// A bidirectional block (DFlash): the mask may see later nodes, and every tile's keys run to
// L + n, its first rows' included; without a mask it is refused.
TEST(TreeAttentionPlanTest, BidirectionalTilesReadTheWholeBlock) {
  std::mt19937 rng(3);
  Batch batch = MakeBatch({{100, 16, 0}}, 16, rng);
  const std::vector<uint64_t> all = AllVisibleMask(16);
  batch.descs[0].ancestor_mask = all;
  const AttnHeads heads{32, 8, 4, 0};  // 4 q heads a KV head: 64 rows, one 64-row tile per head
  auto plan = PlanTreeAttention(batch.descs, heads, 16, 100, kLimits, Split(1));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << "bits above the diagonal";
  batch.descs[0].bidirectional = true;
  plan = PlanTreeAttention(batch.descs, heads, 16, 100, kLimits, Split(1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const AttnWorkItem& item : plan->items) EXPECT_EQ(item.key_end, 116);
  // A chain's first tile would end at its last node: the 64 rows of a 16-node chain with 4 q
  // heads a KV head are one tile, so compare a 32-row-per-head split of the block instead.
  Batch chain = MakeBatch({{100, 16, 0}}, 16, rng);
  chain.descs[0].ancestor_mask = {};
  const AttnHeads wide{64, 8, 8, 0};  // 8 q heads a KV head: 128 rows, two 64-row tiles
  auto causal = PlanTreeAttention(chain.descs, wide, 16, 100, kLimits, Split(1));
  ASSERT_TRUE(causal.ok()) << causal.status();
  plan = PlanTreeAttention(batch.descs, wide, 16, 100, kLimits, Split(1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<int> causal_ends, block_ends;
  for (const AttnWorkItem& item : causal->items) causal_ends.insert(item.key_end);
  for (const AttnWorkItem& item : plan->items) block_ends.insert(item.key_end);
  EXPECT_EQ(causal_ends, (std::set<int>{108, 116}));
  EXPECT_EQ(block_ends, (std::set<int>{116}));
  batch.descs[0].ancestor_mask = {};
  EXPECT_EQ(PlanTreeAttention(batch.descs, heads, 16, 100, kLimits, Split(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TreeAttentionPlanTest, MalformedBatchesNameTheProblem) {
  std::mt19937 rng(1);
  Batch batch = MakeBatch({{20, 5, 0}}, 16, rng);
  const AttnHeads heads{8, 4, 2, 0};
  auto expect_error = [&](const std::string& needle, absl::StatusCode code) {
    auto plan = PlanTreeAttention(batch.descs, heads, 16, 100, kLimits, Split(10));
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_EQ(plan.status().code(), code) << plan.status();
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status();
  };
  batch.descs[0].num_nodes = 0;
  expect_error("num_nodes 0 < 1", absl::StatusCode::kInvalidArgument);
  batch.descs[0].num_nodes = 5;
  batch.descs[0].first_query = 5;
  expect_error("first_query 5 outside [0, 5)", absl::StatusCode::kInvalidArgument);
  batch.descs[0].first_query = 0;
  batch.descs[0].prefix_len = 40;
  expect_error("cannot hold 45 slots", absl::StatusCode::kInvalidArgument);
  batch.descs[0].prefix_len = 20;
  batch.pages[0][1] = 100;
  expect_error("page id 100 at index 1 outside the pool", absl::StatusCode::kInvalidArgument);
  batch.pages[0][1] = 1;
  batch.masks[0][2] |= uint64_t{1} << 4;  // node 2 "sees" node 4
  expect_error("row 2 has a bit above 2", absl::StatusCode::kInvalidArgument);
  batch.masks[0][2] = 0;
  expect_error("row 2 lacks bit 2", absl::StatusCode::kInvalidArgument);
  batch.descs[0].ancestor_mask = absl::MakeConstSpan(batch.masks[0]).subspan(1);
  expect_error("has 4 words, want 5", absl::StatusCode::kInvalidArgument);

  auto bad_heads = PlanTreeAttention({}, {6, 4, 2, 0}, 16, 100, kLimits, Split(10));
  EXPECT_EQ(bad_heads.status().code(), absl::StatusCode::kInvalidArgument) << bad_heads.status();
  auto bad_page = PlanTreeAttention({}, heads, 24, 100, kLimits, Split(10));
  EXPECT_NE(bad_page.status().message().find("page_size 24"), std::string::npos);
  AttnPlanLimits tight = kLimits;
  tight.max_items = 0;
  Batch big = MakeBatch({{4096, 16, 0}}, 16, rng);
  auto over = PlanTreeAttention(big.descs, heads, 16, 1 << 20, tight, Split(1000));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
}

}  // namespace
}  // namespace treespec::gpu
