// Paged KV cache with the operations speculation needs (DESIGN §3):
// reserve slots for a tree, commit an accepted path, truncate, free.
//
// One page table (PagedKvCache) is shared by all TP ranks; each rank owns a KvPool holding what
// every layer caches for its heads (per-head K/V, or MLA's shared latent), indexed by the same
// page ids.
#ifndef TREESPEC_COMMON_MODEL_KV_CACHE_H_
#define TREESPEC_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace treespec {

using SeqId = int64_t;

// What one layer caches per token slot on one rank: K of k_width values and V of v_width.
// GQA: the rank's KV heads × head_dim each. MLA: K is the latent [c_kv, k_rope]
// (kv_lora_rank + qk_rope_head_dim) shared by every head, and V is empty (v_width 0): values
// are read from c_kv, the key entry's first kv_lora_rank values.
struct KvLayout {
  int k_width = 0;
  int v_width = 0;
};

// K/V storage of one rank: for each layer, pages of `page_size` slots of that layer's layout.
class KvPool {
 public:
  KvPool(std::vector<KvLayout> layers, int num_pages, int page_size);
  // Every layer [num_kv_heads × head_dim] for K and V.
  KvPool(int num_layers, int num_pages, int page_size, int num_kv_heads, int head_dim);

  // K (or V) of one slot: [k_width] ([v_width]; V is not addressable when v_width is 0).
  float* K(int layer, int page, int offset);
  float* V(int layer, int page, int offset);
  const float* K(int layer, int page, int offset) const;
  const float* V(int layer, int page, int offset) const;
  // Copies both K and V of every layer from one slot to another.
  void CopySlot(int src_page, int src_offset, int dst_page, int dst_offset);

  const KvLayout& layout(int layer) const { return layers_[layer]; }

 private:
  size_t SlotIndex(int page, int offset) const {
    return static_cast<size_t>(page) * page_size_ + offset;
  }

  std::vector<KvLayout> layers_;  // [num_layers]
  int num_pages_, page_size_;
  std::vector<std::vector<float>> k_;  // [num_layers][num_pages, page_size, k_width]
  std::vector<std::vector<float>> v_;  // [num_layers][num_pages, page_size, v_width]
};

// Page tables of all sequences plus the free list. Thread-safe.
class PagedKvCache {
 public:
  PagedKvCache(int num_pages, int page_size);

  int page_size() const { return page_size_; }
  int num_pages() const { return num_pages_; }
  int free_pages() const;

  SeqId CreateSequence();
  // Ensures slots [0, num_slots) of `seq` have pages. RESOURCE_EXHAUSTED when the pool is out.
  absl::Status Reserve(SeqId seq, int num_slots);
  // Drops pages wholly beyond `num_slots`.
  void Truncate(SeqId seq, int num_slots);
  void Free(SeqId seq);
  int num_reserved_slots(SeqId seq) const;

  // (page, offset) of logical slot `slot` of `seq`; the slot must be reserved.
  std::pair<int, int> Locate(SeqId seq, int slot) const;
  // Page list of `seq` (copy; stable across concurrent Reserve of other sequences).
  std::vector<int> Pages(SeqId seq) const;

 private:
  const int num_pages_;
  const int page_size_;
  mutable std::mutex mu_;
  std::vector<int> free_list_;
  absl::flat_hash_map<SeqId, std::vector<int>> tables_;
  SeqId next_id_ = 1;
};

// Checks a path for CommitPath (starts at node 0, strictly increasing, within the sequence's
// reserved slots) and returns the sequence's pages; aborts with a message otherwise (a caller
// bug, as in CommitPath). Shared with the GPU backend's commit.
std::vector<int> CheckCommitPath(const PagedKvCache& cache, SeqId seq, int committed_len,
                                 absl::Span<const int> path);

// Moves the accepted path into place in every pool (DESIGN §3 step 5): slot L+path[j] -> L+j for
// j = 1..k, ascending, skipping j == path[j]; then truncates `seq` to L + k + 1 slots.
// `path` = [c0 = 0, c1, ..., ck] (tree node indices, strictly increasing).
void CommitPath(PagedKvCache& cache, absl::Span<KvPool* const> pools, SeqId seq, int committed_len,
                absl::Span<const int> path);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_KV_CACHE_H_
