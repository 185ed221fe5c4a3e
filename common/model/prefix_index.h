// The prefix cache's index (issue 37): which KV pages hold which full page of tokens after which
// prefix, so that a request whose prompt begins with a cached prefix reuses those pages instead
// of computing them again.
//
// Pages are keyed by a chained hash (vLLM's automatic prefix caching): a page's key mixes its
// parent's key with its own tokens, so one lookup per page walks a prompt from its start. A
// hash match alone is never trusted: an entry also keeps its tokens and its parent page with
// that page's generation (bumped each time the page is handed out for new contents), and a
// lookup matches only when all three agree — so a collision, or a parent evicted and reused for
// other tokens, costs a miss, never wrong K/V. Chosen over a radix tree: a page is the unit the
// cache shares and evicts either way, a hash map per page is simple and flat, and the explicit
// parent check gives the tree's exactness.
//
// Not thread-safe: PagedKvCache holds it under its lock.
#ifndef TREESPEC_COMMON_MODEL_PREFIX_INDEX_H_
#define TREESPEC_COMMON_MODEL_PREFIX_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace treespec {

class PrefixIndex {
 public:
  explicit PrefixIndex(int num_pages) : entries_(num_pages), generation_(num_pages, 0) {}

  // The key of a page holding `tokens` after the page keyed `parent_key` (kRootKey for the
  // first page).
  static constexpr uint64_t kRootKey = 0x9e3779b97f4a7c15ull;
  static uint64_t Key(uint64_t parent_key, absl::Span<const int32_t> tokens);

  // The cached page holding `tokens` (whose key is `key`) after `parent` (-1: at the start), or
  // -1.
  int Find(uint64_t key, int parent, absl::Span<const int32_t> tokens) const;
  bool Contains(int page) const { return entries_[page].cached; }

  // Indexes `page` as holding `tokens` after `parent` (-1: at the start); whether it did. A
  // key already indexed keeps its page (the caller found no match, so this is a collision:
  // `page` stays out of the index).
  bool Insert(int page, uint64_t key, int parent, absl::Span<const int32_t> tokens);
  // Takes `page` out of the index (evicted); its children can no longer match.
  void Erase(int page);
  // `page` is about to hold new contents: entries naming it as their parent stop matching.
  void NewGeneration(int page) { ++generation_[page]; }
  uint32_t generation(int page) const { return generation_[page]; }

  int size() const { return static_cast<int>(by_key_.size()); }

 private:
  struct Entry {
    bool cached = false;
    uint64_t key = 0;
    int parent = -1;
    uint32_t parent_generation = 0;
    std::vector<int32_t> tokens;  // [page_size]
  };
  absl::flat_hash_map<uint64_t, int> by_key_;
  std::vector<Entry> entries_;        // [num_pages]
  std::vector<uint32_t> generation_;  // [num_pages]
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_PREFIX_INDEX_H_
