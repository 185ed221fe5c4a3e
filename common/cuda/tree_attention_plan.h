// How one tree-attention launch divides its work among CTAs (DESIGN §3 step 2). Host-only
// C++ (no CUDA), so the partitioning is unit-tested on any machine.
//
// A launch covers a batch of sequences. For sequence b with committed length L, n tree nodes
// and query nodes [first_query, n), and for each KV head h, the query rows are
// (query node, q head of h) pairs, node-major: row r is node first_query + r / G_h with the
// (r % G_h)-th q head of h, where G_h is the number of q heads reading h. Rows are cut into
// tiles of 64 or 128 rows (one CTA's query tile, on tensor cores); each tile streams the keys
// [0, L + last node of the tile + 1) — the committed prefix, then the tree slots under the
// ancestor mask — and that key range is split into chunks of whole key tiles so the batch
// fills the GPU (flash-decoding). The partial results of a split tile are merged by
// log-sum-exp either by the tile's last CTA to finish (a per-tile counter; launches whose split
// tiles all have few partial rows, such as one node's) or in a second launch whose CTAs each
// take a few rows of one split tile (AttnMergeItem): a large tile's partials are then read by
// many SMs at once, not one.
#ifndef TREESPEC_COMMON_CUDA_TREE_ATTENTION_PLAN_H_
#define TREESPEC_COMMON_CUDA_TREE_ATTENTION_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace treespec::gpu {

// Query rows per CTA: 64 (4 warps × 16) or 128 (8 warps). One launch uses one size.
inline constexpr int kAttnSmallTileRows = 64;
inline constexpr int kAttnMaxTileRows = 128;
inline constexpr int kAttnTileKeys = 64;   // keys per pipeline stage
inline constexpr int kAttnMaxSplits = 64;  // CTAs sharing one query tile, at most

// Which local q heads read which local KV head. A rank may hold a slice of the heads that
// starts inside a GQA group (DESIGN §6), so local q head j reads local KV head
// (j + q_head_shift) / group_size, with 0 <= q_head_shift < group_size.
struct AttnHeads {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int group_size = 1;
  int q_head_shift = 0;

  int FirstQHead(int kv_head) const;  // first local q head reading kv_head
  int NumQHeads(int kv_head) const;   // how many local q heads read kv_head (>= 1)
};

// One sequence of the batch as the planner sees it (host data).
struct AttnSeqDesc {
  absl::Span<const int32_t> pages;  // page ids; slots [0, L + n) must be covered
  int prefix_len = 0;               // L
  int num_nodes = 0;                // n >= 1; node i's K/V is in slot L + i
  int first_query = 0;              // queries are nodes [first_query, n)
  // [n, ceil(n / 64)] ancestor bitmask (bit j of row i: j is i or an ancestor of i), or empty
  // for a chain (node i sees nodes 0..i: prefill and chain drafts).
  absl::Span<const uint64_t> ancestor_mask;
  // The mask may set bits above the diagonal (a DFlash block: every node sees all n nodes), so
  // every tile's keys run to L + n, not to its last node. Needs a mask.
  bool bidirectional = false;
};

// What the kernel reads per sequence (device layout; 8 int32).
struct AttnSeqInfo {
  int32_t prefix_len;
  int32_t num_nodes;
  int32_t first_query;
  int32_t q_row_begin;  // first row of this sequence's queries in q and out
  int32_t mask_begin;   // offset of row 0 of its ancestor mask in the mask array; -1 = chain
  int32_t mask_words;   // words per mask row
  int32_t page_begin;   // offset of its page list in the page table
  int32_t num_pages;
};

// One CTA's work (device layout; 12 int32). Copies of its sequence's page_begin and prefix_len
// let the CTA request its first K/V tile without waiting for the AttnSeqInfo load.
struct AttnWorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t row_begin;  // first query row of the tile (rows of this (seq, kv_head))
  int32_t key_begin;  // keys [key_begin, key_end) of the tile's key range
  int32_t key_end;
  int32_t split;         // index of this CTA among those sharing the tile
  int32_t partial_base;  // split tiles: first partial-result slot of the tile (its splits use
                         // slots partial_base + split); -1 when not split
  int32_t num_splits;    // CTAs sharing the tile (1: writes the output directly)
  int32_t page_begin;    // = seqs[seq].page_begin
  int32_t prefix_len;    // = seqs[seq].prefix_len
  // Split tiles merged by their last CTA: the tile's counter (0 <= c < number of such tiles);
  // -1 otherwise (unsplit, or merged by the merge launch).
  int32_t merge_counter;
  int32_t unused;
};

// One CTA of the merge launch: rows [row_begin, row_begin + rows) of a split tile (device
// layout; 8 int32). Row indices are those of AttnWorkItem::row_begin (rows of this (seq,
// kv_head)); the tile's partial results hold its rows from tile_row_begin on.
struct AttnMergeItem {
  int32_t seq;
  int32_t kv_head;
  int32_t row_begin;
  int32_t rows;
  int32_t tile_row_begin;
  int32_t partial_base;
  int32_t num_splits;
  int32_t q_row_begin;  // = seqs[seq].q_row_begin
};

// Rows per merge CTA for a tile of `tile_rows` rows split `splits` ways: ceil(64 / splits), so
// a merge CTA holds at most (64 + splits) partial rows, and a split tile has at most 2 ×
// splits merge CTAs (AttnPlan::merges.size() <= 2 × items.size()).
inline int AttnMergeRows(int tile_rows, int splits) {
  const int rows = (kAttnSmallTileRows + splits - 1) / splits;
  return rows < tile_rows ? rows : tile_rows;
}

struct AttnPlanLimits {
  int max_seqs = 0;
  int max_pages = 0;       // total page-table entries of a batch
  int max_mask_words = 0;  // total ancestor-mask words of a batch
  int max_items = 0;       // CTAs of one launch
  int max_partials = 0;    // partial results of one launch (split CTAs)
};

// The plan of one launch, ready to be copied to the device as is.
struct AttnPlan {
  std::vector<AttnSeqInfo> seqs;
  std::vector<AttnWorkItem> items;
  std::vector<AttnMergeItem> merges;  // empty when no tile is split or every split tile is fused
  std::vector<int32_t> page_table;
  std::vector<uint64_t> masks;
  int num_split_tiles = 0;
  int num_fused_tiles = 0;  // split tiles merged by their last CTA (counters 0 .. this - 1)
  int num_partials = 0;
  int num_query_rows = 0;  // rows of q / out (sum over sequences of n - first_query)
  int tile_rows = kAttnSmallTileRows;
};

// The tile size the attention uses when asked for 0 (automatic), by the most query rows R of a
// (sequence, KV head): 128 rows when R > 64 — a 17-node tree of a model with 4 q heads per KV
// head would otherwise stream its keys twice — else 64 (two CTAs per SM at head dim 128). For
// the wgmma path (`wgmma`), 128 only for 64 < R <= 128: past that, tiles of 64 rows (two
// independent warpgroups per SM, whose softmax and matrix products interleave) are faster on
// the H200 although they stream the keys more often (docs/experiments/README.md, '64- against
// 128-row query tiles').
int AutoTileRows(absl::Span<const AttnSeqDesc> seqs, const AttnHeads& heads, bool wgmma = false);

// The default of AttnSplitOptions::fused_merge_row_splits in the model (TreeAttentionOptions).
// 80 lies between what merges faster in the last CTA than in the merge launch, one node's 4 rows
// split 17 ways (1k: 68), and what merges slower, 4 rows split 33 ways (8k: 132) or 8 rows split
// 17 ways (136) (measured on the H200: docs/experiments/README.md, 'small split tiles merged by
// their last CTA').
inline constexpr int kAttnDefaultFusedMergeRowSplits = 80;

// The planner's estimate of a launch's critical path (AttnSplitOptions::sms), in key tiles of a
// CTA alone on its SM: the longest CTA's key tiles, × kAttnSharedSmSlowdown when the launch has
// more CTAs than SMs (some share one), plus kAttnMergeKeyTiles when some tile is split (its merge).
// On the H200 a 64-row wgmma CTA streams its key tiles 1.44× slower beside a second CTA than
// alone, and the merge launch takes 4–10 µs, about 6 key tiles (measured:
// docs/experiments/README.md, 'one attention CTA per SM').
inline constexpr double kAttnSharedSmSlowdown = 1.44;
inline constexpr int kAttnMergeKeyTiles = 6;

// How a launch is cut into CTAs.
struct AttnSplitOptions {
  // CTAs of tile_rows rows that fill the GPU (SMs × resident CTAs per SM): key ranges are split
  // until the batch has about that many.
  int target_ctas = 1;
  int min_split_tiles = 1;             // key tiles per split, at least
  int tile_rows = kAttnSmallTileRows;  // 64 or 128
  // How a tile's key range is cut. true: into floor(its key tiles × target_ctas / the batch's
  // key tiles) splits, so the batch has between target_ctas − tiles and target_ctas CTAs.
  // false: into splits of a whole number of key tiles, ceil(the batch's key tiles /
  // target_ctas) at least, which leaves CTA slots empty when that number is small (32 tiles of
  // 17 key tiles at 264 CTAs: 5 splits of 3–4 key tiles, 160 CTAs, against 8 splits, 256).
  bool proportional_splits = true;
  // When every split tile has valid rows × splits <= this, each is merged by its last CTA (no
  // merge launch); otherwise all go to the merge launch. 0: every split tile by the merge launch.
  int fused_merge_row_splits = 0;
  // The GPU's SMs, or 0. When 0 < sms < target_ctas (more than one resident CTA per SM), the
  // splits are also worked out for sms CTAs (one per SM), and those are kept when their
  // estimated critical path (above) is shorter: a launch that already has about a tile per SM
  // and splits only its longer tiles puts the unsplit ones beside a second CTA, where they run
  // slower than alone, and pays a merge (1k / 256 nodes: 128 tiles of 17–20 key tiles, where 224
  // CTAs and a merge launch take longer than 128 CTAs; measured: docs/experiments/README.md, 'one
  // attention CTA per SM').
  int sms = 0;
};

// Partitions a batch into query tiles of `split.tile_rows` rows (64 or 128), splits key ranges
// as `split` says, and fewer when more partial results than limits.max_partials would be needed.
// Page ids must lie in [0, pool_pages). Errors (INVALID_ARGUMENT / RESOURCE_EXHAUSTED) name the
// sequence and field: bad lengths, too few pages or a page outside the pool, a malformed mask, a
// limit exceeded.
absl::StatusOr<AttnPlan> PlanTreeAttention(absl::Span<const AttnSeqDesc> seqs,
                                           const AttnHeads& heads, int page_size, int pool_pages,
                                           const AttnPlanLimits& limits,
                                           const AttnSplitOptions& split);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_TREE_ATTENTION_PLAN_H_
