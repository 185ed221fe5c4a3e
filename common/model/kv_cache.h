// Paged KV cache with the operations speculation needs (DESIGN §3):
// reserve slots for a tree, commit an accepted path, truncate, free.
//
// One page table (PagedKvCache) is shared by all TP ranks; each rank owns a KvPool holding what
// every layer caches for its heads (per-head K/V, or MLA's shared latent), indexed by the same
// page ids.
#ifndef TREESPEC_COMMON_MODEL_KV_CACHE_H_
#define TREESPEC_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/prefix_index.h"

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

  // K (or V) of one slot: [k_width] ([v_width]; V is null when v_width is 0).
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

// Page tables of all sequences, the free list and the prefix cache. Thread-safe.
//
// Prefix cache: CachePages makes a sequence's full pages of final tokens reusable; a new
// sequence attaches the longest cached run that begins its prompt (AttachCachedPrefix), shared
// read-only with every other holder. A page is free, held (by one or more sequences), or
// cached and unheld; unheld cached pages are evicted least recently released first when a
// Reserve needs room, so free_pages() counts them as free. A sequence never writes into its
// attached pages: they are full and lie below its committed length.
class PagedKvCache {
 public:
  PagedKvCache(int num_pages, int page_size);

  int page_size() const { return page_size_; }
  int num_pages() const { return num_pages_; }
  // Pages a Reserve can take: free ones and unheld cached ones (evicted on demand).
  int free_pages() const;
  // Pages in the prefix cache (held or not) and those of them no sequence holds.
  int cached_pages() const;
  int evictable_pages() const;
  // Cached pages evicted for new contents since the start.
  int64_t evicted_pages() const;

  SeqId CreateSequence();
  // Ensures slots [0, num_slots) of `seq` have pages. RESOURCE_EXHAUSTED when the pool is out.
  absl::Status Reserve(SeqId seq, int num_slots);
  // Drops pages wholly beyond `num_slots`.
  void Truncate(SeqId seq, int num_slots);
  void Free(SeqId seq);
  int num_reserved_slots(SeqId seq) const;

  // Attaches to `seq`, which must hold no pages yet, the longest run of cached pages holding
  // whole pages of `tokens` from its start, leaving at least the last token uncached (its
  // logits must be computed). Returns the number of tokens attached (a multiple of the page
  // size); their slots are filled and final.
  int AttachCachedPrefix(SeqId seq, absl::Span<const int32_t> tokens);
  // How many of the pages AttachCachedPrefix would attach for `tokens` some sequence holds now
  // (attaching those takes no free page).
  int HeldCachedPrefixPages(absl::Span<const int32_t> tokens) const;
  // Adds the full pages of `seq` among its first tokens.size() slots, which hold `tokens` and
  // whose K/V are final, to the prefix cache. Pages whose contents are cached already (another
  // sequence computed the same prefix) stay out, and are freed as usual. Incremental: a call
  // goes on from the pages an earlier call for `seq` covered (their tokens must not differ), so
  // a sequence may call it as every page completes.
  void CachePages(SeqId seq, absl::Span<const int32_t> tokens);

  // (page, offset) of logical slot `slot` of `seq`; the slot must be reserved.
  std::pair<int, int> Locate(SeqId seq, int slot) const;
  // Page list of `seq` (copy; stable across concurrent Reserve of other sequences).
  std::vector<int> Pages(SeqId seq) const;

 private:
  // Drops one holder of `page`: an unheld cached page becomes evictable, another one free.
  void Release(int page);  // requires mu_
  // The cached pages holding whole pages of `tokens` from its start, all but its last token.
  std::vector<int> MatchPrefix(absl::Span<const int32_t> tokens) const;  // requires mu_

  const int num_pages_;
  const int page_size_;
  mutable std::mutex mu_;
  std::vector<int> free_list_;
  absl::flat_hash_map<SeqId, std::vector<int>> tables_;
  // How far CachePages got for a sequence: the pages walked, the last one's key and the indexed
  // page holding it (with that page's generation, to notice it was evicted and reused since).
  struct CacheChain {
    size_t pages = 0;
    uint64_t key = 0;
    int parent = -1;
    uint32_t parent_generation = 0;
    bool stopped = false;  // a page indexed under another chain, or a collision: no further
  };
  absl::flat_hash_map<SeqId, CacheChain> chains_;
  SeqId next_id_ = 1;
  std::vector<int> holders_;  // [num_pages] sequences holding each page
  PrefixIndex index_;
  std::list<int> evictable_;  // unheld cached pages, least recently released first
  std::vector<std::list<int>::iterator> evictable_at_;  // [num_pages] valid when evictable
  int64_t evicted_ = 0;
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
