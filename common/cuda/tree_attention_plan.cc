#include "common/cuda/tree_attention_plan.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace treespec::gpu {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status ValidateSeq(const AttnSeqDesc& s, int index, int page_size, int pool_pages) {
  auto bad = [index](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree attention: sequence ", index, ": ", parts...));
  };
  if (s.prefix_len < 0) return bad("prefix_len ", s.prefix_len, " < 0");
  if (s.num_nodes < 1) return bad("num_nodes ", s.num_nodes, " < 1");
  if (s.first_query < 0 || s.first_query >= s.num_nodes) {
    return bad("first_query ", s.first_query, " outside [0, ", s.num_nodes, ")");
  }
  const int64_t slots = static_cast<int64_t>(s.prefix_len) + s.num_nodes;
  if (slots > INT32_MAX / 2) return bad("prefix_len + num_nodes = ", slots, " is too long");
  if (static_cast<int64_t>(s.pages.size()) * page_size < slots) {
    return bad(s.pages.size(), " pages of ", page_size, " slots cannot hold ", slots, " slots");
  }
  for (size_t i = 0; i < s.pages.size(); ++i) {
    if (s.pages[i] < 0 || s.pages[i] >= pool_pages) {
      return bad("page id ", s.pages[i], " at index ", i, " outside the pool [0, ", pool_pages,
                 ")");
    }
  }
  if (s.ancestor_mask.empty()) {
    if (s.bidirectional) return bad("a bidirectional sequence needs a mask");
    return absl::OkStatus();
  }
  const int words = static_cast<int>(CeilDiv(s.num_nodes, 64));
  if (s.ancestor_mask.size() != static_cast<size_t>(s.num_nodes) * words) {
    return bad("ancestor mask has ", s.ancestor_mask.size(), " words, want ", s.num_nodes, " × ",
               words);
  }
  if (s.bidirectional) return absl::OkStatus();  // any bits: every tile reads all n keys
  // Parents precede children, so row i may only have bits j <= i, and must have bit i: the
  // kernel bounds each tile's keys by its last node.
  for (int i = 0; i < s.num_nodes; ++i) {
    const uint64_t* row = s.ancestor_mask.data() + static_cast<size_t>(i) * words;
    if (((row[i / 64] >> (i % 64)) & 1) == 0) return bad("ancestor mask row ", i, " lacks bit ", i);
    for (int w = i / 64; w < words; ++w) {
      const uint64_t later = w == i / 64 ? (i % 64 == 63 ? 0 : row[w] >> (i % 64 + 1)) : row[w];
      if (later != 0) return bad("ancestor mask row ", i, " has a bit above ", i);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int AttnHeads::FirstQHead(int kv_head) const {
  return std::max(0, kv_head * group_size - q_head_shift);
}

int AttnHeads::NumQHeads(int kv_head) const {
  const int end = std::min(num_q_heads, (kv_head + 1) * group_size - q_head_shift);
  return end - FirstQHead(kv_head);
}

int AutoTileRows(absl::Span<const AttnSeqDesc> seqs, const AttnHeads& heads, bool wgmma) {
  int max_group = 0;
  for (int h = 0; h < heads.num_kv_heads; ++h) max_group = std::max(max_group, heads.NumQHeads(h));
  int64_t max_rows = 0;
  for (const AttnSeqDesc& s : seqs) {
    max_rows =
        std::max<int64_t>(max_rows, static_cast<int64_t>(s.num_nodes - s.first_query) * max_group);
  }
  if (max_rows <= kAttnSmallTileRows) return kAttnSmallTileRows;
  return !wgmma || max_rows <= kAttnMaxTileRows ? kAttnMaxTileRows : kAttnSmallTileRows;
}

absl::StatusOr<AttnPlan> PlanTreeAttention(absl::Span<const AttnSeqDesc> seqs,
                                           const AttnHeads& heads, int page_size, int pool_pages,
                                           const AttnPlanLimits& limits,
                                           const AttnSplitOptions& split) {
  const int tile_rows = split.tile_rows;
  if (tile_rows != kAttnSmallTileRows && tile_rows != kAttnMaxTileRows) {
    return absl::InvalidArgumentError(absl::StrCat("tree attention: tile_rows ", tile_rows,
                                                   " is not ", kAttnSmallTileRows, " or ",
                                                   kAttnMaxTileRows));
  }
  if (heads.num_q_heads < 1 || heads.num_kv_heads < 1 || heads.group_size < 1 ||
      heads.q_head_shift < 0 || heads.q_head_shift >= heads.group_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree attention: bad heads: ", heads.num_q_heads, " q, ", heads.num_kv_heads,
                     " kv, group ", heads.group_size, ", shift ", heads.q_head_shift));
  }
  for (int h = 0; h < heads.num_kv_heads; ++h) {
    if (heads.NumQHeads(h) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tree attention: local kv head ", h, " is read by no local q head"));
    }
  }
  if (heads.FirstQHead(heads.num_kv_heads - 1) + heads.NumQHeads(heads.num_kv_heads - 1) !=
      heads.num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tree attention: ", heads.num_q_heads, " q heads do not map onto ", heads.num_kv_heads,
        " kv heads with group ", heads.group_size, " and shift ", heads.q_head_shift));
  }
  if (page_size < 16 || (page_size & (page_size - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree attention: page_size ", page_size, " is not a power of two >= 16"));
  }
  if (static_cast<int>(seqs.size()) > limits.max_seqs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tree attention: ", seqs.size(), " sequences > limit ", limits.max_seqs));
  }
  AttnPlan plan;
  plan.tile_rows = tile_rows;
  plan.seqs.reserve(seqs.size());
  for (size_t b = 0; b < seqs.size(); ++b) {
    const AttnSeqDesc& s = seqs[b];
    if (absl::Status st = ValidateSeq(s, static_cast<int>(b), page_size, pool_pages); !st.ok()) {
      return st;
    }
    AttnSeqInfo info;
    info.prefix_len = s.prefix_len;
    info.num_nodes = s.num_nodes;
    info.first_query = s.first_query;
    info.q_row_begin = plan.num_query_rows;
    info.mask_begin = s.ancestor_mask.empty() ? -1 : static_cast<int32_t>(plan.masks.size());
    info.mask_words = static_cast<int32_t>(CeilDiv(s.num_nodes, 64));
    info.page_begin = static_cast<int32_t>(plan.page_table.size());
    info.num_pages = static_cast<int32_t>(s.pages.size());
    plan.seqs.push_back(info);
    plan.num_query_rows += s.num_nodes - s.first_query;
    plan.page_table.insert(plan.page_table.end(), s.pages.begin(), s.pages.end());
    plan.masks.insert(plan.masks.end(), s.ancestor_mask.begin(), s.ancestor_mask.end());
  }
  if (static_cast<int64_t>(plan.page_table.size()) > limits.max_pages) {
    return absl::ResourceExhaustedError(absl::StrCat("tree attention: ", plan.page_table.size(),
                                                     " page-table entries > limit ",
                                                     limits.max_pages));
  }
  if (static_cast<int64_t>(plan.masks.size()) > limits.max_mask_words) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tree attention: ", plan.masks.size(), " mask words > limit ", limits.max_mask_words));
  }

  // Every (sequence, kv head, row tile) with the keys it needs.
  struct Tile {
    int seq, kv_head, row_begin, rows, key_end;  // rows: of this (seq, kv_head), all tiles
  };
  std::vector<Tile> tiles;
  int64_t total_key_tiles = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const AttnSeqDesc& s = seqs[b];
    const int queries = s.num_nodes - s.first_query;
    for (int h = 0; h < heads.num_kv_heads; ++h) {
      const int per_node = heads.NumQHeads(h);
      const int rows = queries * per_node;
      for (int row = 0; row < rows; row += tile_rows) {
        const int last_row = std::min(rows, row + tile_rows) - 1;
        const int last_node = s.first_query + last_row / per_node;
        const int key_end = s.prefix_len + (s.bidirectional ? s.num_nodes : last_node + 1);
        tiles.push_back({static_cast<int>(b), h, row, rows, key_end});
        total_key_tiles += CeilDiv(key_end, kAttnTileKeys);
      }
    }
  }
  // Splits per tile: enough to fill the GPU (target_ctas CTAs), each at least min_split_tiles
  // key tiles long, and no more partial results than the limit allows (a smaller target
  // otherwise).
  const int64_t min_split = std::max(1, split.min_split_tiles);
  auto splits_of = [&](const Tile& t, int64_t target) {
    const int64_t key_tiles = CeilDiv(t.key_end, kAttnTileKeys);
    const int64_t splits = split.proportional_splits
                               ? key_tiles * target / total_key_tiles
                               : key_tiles / std::max(min_split, CeilDiv(total_key_tiles, target));
    return static_cast<int>(
        std::clamp<int64_t>(std::min(splits, key_tiles / min_split), 1, kAttnMaxSplits));
  };
  int64_t target = std::max(1, split.target_ctas);
  for (; target > 1; target /= 2) {
    int64_t partials = 0;
    for (const Tile& t : tiles) {
      const int splits = splits_of(t, target);
      if (splits > 1) partials += splits;
    }
    if (partials <= limits.max_partials) break;
  }
  // One CTA per SM instead, when that shortens the estimated critical path (AttnSplitOptions::sms).
  auto critical_path = [&](int64_t target_ctas) {
    int64_t ctas = 0, longest = 0;
    bool any_split = false;
    for (const Tile& t : tiles) {
      const int splits = splits_of(t, target_ctas);
      ctas += splits;
      any_split = any_split || splits > 1;
      longest = std::max(longest, CeilDiv(CeilDiv(t.key_end, kAttnTileKeys), splits));
    }
    return static_cast<double>(longest) * (ctas > split.sms ? kAttnSharedSmSlowdown : 1.0) +
           (any_split ? kAttnMergeKeyTiles : 0);
  };
  if (split.sms > 0 && split.sms < target && critical_path(split.sms) < critical_path(target)) {
    target = split.sms;
  }
  std::vector<int> tile_splits(tiles.size());
  for (size_t i = 0; i < tiles.size(); ++i) tile_splits[i] = splits_of(tiles[i], target);
  auto valid_rows_of = [&](const Tile& t) { return std::min(tile_rows, t.rows - t.row_begin); };
  // Split tiles are merged by their last CTA only if every split tile of the launch can be: once
  // the merge launch runs for some, a merge in the attention launch only lengthens the critical
  // path (measured on the H200: docs/experiments/README.md, 'attention splits in proportion to
  // their length').
  bool fuse = true;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const int64_t partial_rows = static_cast<int64_t>(valid_rows_of(tiles[i])) * tile_splits[i];
    if (tile_splits[i] > 1 && partial_rows > split.fused_merge_row_splits) fuse = false;
  }
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& t = tiles[i];
    const int64_t key_tiles = CeilDiv(t.key_end, kAttnTileKeys);
    const int splits = tile_splits[i];
    const int valid_rows = valid_rows_of(t);
    const bool fused = splits > 1 && fuse;
    if (splits > 1) ++plan.num_split_tiles;
    for (int s = 0; s < splits; ++s) {
      AttnWorkItem item;
      item.seq = t.seq;
      item.kv_head = t.kv_head;
      item.row_begin = t.row_begin;
      item.key_begin = static_cast<int32_t>(key_tiles * s / splits * kAttnTileKeys);
      item.key_end = static_cast<int32_t>(
          std::min<int64_t>(t.key_end, key_tiles * (s + 1) / splits * kAttnTileKeys));
      item.split = s;
      item.partial_base = splits > 1 ? plan.num_partials : -1;
      item.num_splits = splits;
      item.page_begin = plan.seqs[t.seq].page_begin;
      item.prefix_len = plan.seqs[t.seq].prefix_len;
      item.merge_counter = fused ? plan.num_fused_tiles : -1;
      item.unused = 0;
      plan.items.push_back(item);
    }
    if (fused) ++plan.num_fused_tiles;
    if (splits > 1 && !fused) {
      const int merge_rows = AttnMergeRows(tile_rows, splits);
      for (int r = 0; r < valid_rows; r += merge_rows) {
        AttnMergeItem merge;
        merge.seq = t.seq;
        merge.kv_head = t.kv_head;
        merge.row_begin = t.row_begin + r;
        merge.rows = std::min(merge_rows, valid_rows - r);
        merge.tile_row_begin = t.row_begin;
        merge.partial_base = plan.num_partials;
        merge.num_splits = splits;
        merge.q_row_begin = plan.seqs[t.seq].q_row_begin;
        plan.merges.push_back(merge);
      }
    }
    if (splits > 1) plan.num_partials += splits;
  }
  // CTAs that stream the same keys run side by side (the row tiles of one KV head, split by
  // split), so the second and later reads of a K/V tile hit L2.
  std::stable_sort(
      plan.items.begin(), plan.items.end(), [](const AttnWorkItem& a, const AttnWorkItem& b) {
        return std::tie(a.seq, a.kv_head, a.split) < std::tie(b.seq, b.kv_head, b.split);
      });
  if (static_cast<int64_t>(plan.items.size()) > limits.max_items) {
    return absl::ResourceExhaustedError(absl::StrCat("tree attention: the batch needs ",
                                                     plan.items.size(), " CTAs; the limit is ",
                                                     limits.max_items));
  }
  return plan;
}

}  // namespace treespec::gpu
