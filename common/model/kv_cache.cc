#include "common/model/kv_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace treespec {

KvPool::KvPool(std::vector<KvLayout> layers, int num_pages, int page_size)
    : layers_(std::move(layers)), num_pages_(num_pages), page_size_(page_size) {
  const size_t slots = static_cast<size_t>(num_pages) * page_size;
  for (const KvLayout& l : layers_) {
    k_.emplace_back(slots * l.k_width);
    v_.emplace_back(slots * l.v_width);
  }
}

KvPool::KvPool(int num_layers, int num_pages, int page_size, int num_kv_heads, int head_dim)
    : KvPool(std::vector<KvLayout>(num_layers, {num_kv_heads * head_dim, num_kv_heads * head_dim}),
             num_pages, page_size) {}

float* KvPool::K(int layer, int page, int offset) {
  return k_[layer].data() + SlotIndex(page, offset) * layers_[layer].k_width;
}
float* KvPool::V(int layer, int page, int offset) {
  if (layers_[layer].v_width == 0) return nullptr;  // no V in this layer (MLA)
  return v_[layer].data() + SlotIndex(page, offset) * layers_[layer].v_width;
}
const float* KvPool::K(int layer, int page, int offset) const {
  return k_[layer].data() + SlotIndex(page, offset) * layers_[layer].k_width;
}
const float* KvPool::V(int layer, int page, int offset) const {
  if (layers_[layer].v_width == 0) return nullptr;
  return v_[layer].data() + SlotIndex(page, offset) * layers_[layer].v_width;
}

void KvPool::CopySlot(int src_page, int src_offset, int dst_page, int dst_offset) {
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    const int l = static_cast<int>(layer);
    std::copy_n(K(l, src_page, src_offset), layers_[layer].k_width, K(l, dst_page, dst_offset));
    if (layers_[layer].v_width > 0) {
      std::copy_n(V(l, src_page, src_offset), layers_[layer].v_width, V(l, dst_page, dst_offset));
    }
  }
}

PagedKvCache::PagedKvCache(int num_pages, int page_size)
    : num_pages_(num_pages),
      page_size_(page_size),
      holders_(num_pages, 0),
      index_(num_pages),
      evictable_at_(num_pages) {
  // Popped from the back, so a fresh cache hands out pages 0, 1, 2, ...
  free_list_.reserve(num_pages);
  for (int p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
}

int PagedKvCache::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_list_.size() + evictable_.size());
}

int PagedKvCache::cached_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

int64_t PagedKvCache::evicted_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evicted_;
}

int PagedKvCache::evictable_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(evictable_.size());
}

SeqId PagedKvCache::CreateSequence() {
  std::lock_guard<std::mutex> lock(mu_);
  const SeqId id = next_id_++;
  tables_[id];
  return id;
}

absl::Status PagedKvCache::Reserve(SeqId seq, int num_slots) {
  if (num_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative slot count ", num_slots));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  std::vector<int>& pages = it->second;
  const size_t needed = (static_cast<size_t>(num_slots) + page_size_ - 1) / page_size_;
  if (needed <= pages.size()) return absl::OkStatus();
  const size_t more = needed - pages.size();
  const size_t available = free_list_.size() + evictable_.size();
  if (more > available) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache out of pages: sequence ", seq, " needs ", more, " more page(s) of ",
                     page_size_, " slots, ", available, " of ", num_pages_, " free"));
  }
  for (size_t i = 0; i < more; ++i) {
    int page;
    if (!free_list_.empty()) {
      page = free_list_.back();
      free_list_.pop_back();
    } else {  // evict the least recently released cached page
      page = evictable_.front();
      evictable_.pop_front();
      index_.Erase(page);
      ++evicted_;
    }
    index_.NewGeneration(page);  // new contents: cached pages after the old ones stop matching
    holders_[page] = 1;
    pages.push_back(page);
  }
  return absl::OkStatus();
}

void PagedKvCache::Release(int page) {
  if (--holders_[page] > 0) return;
  if (index_.Contains(page)) {
    evictable_at_[page] = evictable_.insert(evictable_.end(), page);
  } else {
    free_list_.push_back(page);
  }
}

void PagedKvCache::Truncate(SeqId seq, int num_slots) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  std::vector<int>& pages = it->second;
  const size_t keep = (static_cast<size_t>(std::max(num_slots, 0)) + page_size_ - 1) / page_size_;
  while (pages.size() > keep) {
    Release(pages.back());
    pages.pop_back();
  }
  // Slots below the walked pages may be rewritten: the next CachePages walks from the start.
  if (auto c = chains_.find(seq);
      c != chains_.end() &&
      c->second.pages * page_size_ > static_cast<size_t>(std::max(num_slots, 0))) {
    chains_.erase(c);
  }
}

void PagedKvCache::Free(SeqId seq) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Last page first: a prefix's first pages are released last, so they are evicted last.
  for (auto p = it->second.rbegin(); p != it->second.rend(); ++p) Release(*p);
  tables_.erase(it);
  chains_.erase(seq);
}

std::vector<int> PagedKvCache::MatchPrefix(absl::Span<const int32_t> tokens) const {
  std::vector<int> pages;
  if (tokens.empty()) return pages;
  const size_t full = (tokens.size() - 1) / page_size_;  // the last token stays uncached
  uint64_t key = PrefixIndex::kRootKey;
  int parent = -1;
  for (size_t i = 0; i < full; ++i) {
    const absl::Span<const int32_t> page_tokens = tokens.subspan(i * page_size_, page_size_);
    key = PrefixIndex::Key(key, page_tokens);
    const int page = index_.Find(key, parent, page_tokens);
    if (page < 0) break;
    pages.push_back(page);
    parent = page;
  }
  return pages;
}

int PagedKvCache::AttachCachedPrefix(SeqId seq, absl::Span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end() || !it->second.empty()) return 0;
  for (const int page : MatchPrefix(tokens)) {
    if (holders_[page]++ == 0) evictable_.erase(evictable_at_[page]);
    it->second.push_back(page);
  }
  return static_cast<int>(it->second.size()) * page_size_;
}

int PagedKvCache::HeldCachedPrefixPages(absl::Span<const int32_t> tokens) const {
  std::lock_guard<std::mutex> lock(mu_);
  int held = 0;
  for (const int page : MatchPrefix(tokens)) held += holders_[page] > 0 ? 1 : 0;
  return held;
}

void PagedKvCache::CachePages(SeqId seq, absl::Span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<int>& pages = it->second;
  const size_t full = std::min(tokens.size() / page_size_, pages.size());
  CacheChain& chain = chains_[seq];
  if (chain.pages == 0 ||
      (chain.parent >= 0 && (!index_.Contains(chain.parent) ||
                             index_.generation(chain.parent) != chain.parent_generation))) {
    // From the start: nothing walked yet, or the page the walk stood on was evicted since.
    chain = CacheChain{0, PrefixIndex::kRootKey, -1, 0, false};
  }
  for (size_t i = chain.pages; i < full && !chain.stopped; ++i) {
    const absl::Span<const int32_t> page_tokens = tokens.subspan(i * page_size_, page_size_);
    const uint64_t key = PrefixIndex::Key(chain.key, page_tokens);
    int indexed = index_.Find(key, chain.parent, page_tokens);
    if (indexed < 0) {
      // A page indexed under another chain, or a key collision: the chain stops here.
      if (index_.Contains(pages[i]) || !index_.Insert(pages[i], key, chain.parent, page_tokens)) {
        chain.stopped = true;
        break;
      }
      indexed = pages[i];
    }
    chain = CacheChain{i + 1, key, indexed, index_.generation(indexed), false};
  }
}

int PagedKvCache::num_reserved_slots(SeqId seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  return static_cast<int>(it->second.size()) * page_size_;
}

std::pair<int, int> PagedKvCache::Locate(SeqId seq, int slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) Fatal(absl::StrCat("Locate: unknown sequence ", seq));
  const int page_index = slot / page_size_;
  if (slot < 0 || page_index >= static_cast<int>(it->second.size())) {
    Fatal(absl::StrCat("Locate: slot ", slot, " of sequence ", seq, " is not reserved"));
  }
  return {it->second[page_index], slot % page_size_};
}

std::vector<int> PagedKvCache::Pages(SeqId seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second;
}

std::vector<int> CheckCommitPath(const PagedKvCache& cache, SeqId seq, int committed_len,
                                 absl::Span<const int> path) {
  if (path.empty() || path[0] != 0) Fatal("CommitPath: path must start at node 0");
  for (size_t j = 1; j < path.size(); ++j) {
    if (path[j] <= path[j - 1]) Fatal("CommitPath: path must be strictly increasing");
  }
  std::vector<int> pages = cache.Pages(seq);
  const int reserved = static_cast<int>(pages.size()) * cache.page_size();
  if (committed_len < 0 || committed_len + path.back() >= reserved) {
    Fatal(absl::StrCat("CommitPath: node ", path.back(), " after ", committed_len,
                       " committed slots is beyond the ", reserved, " reserved slots of sequence ",
                       seq));
  }
  return pages;
}

void CommitPath(PagedKvCache& cache, absl::Span<KvPool* const> pools, SeqId seq, int committed_len,
                absl::Span<const int> path) {
  const std::vector<int> pages = CheckCommitPath(cache, seq, committed_len, path);
  const int k = static_cast<int>(path.size()) - 1;
  const int ps = cache.page_size();
  // Ascending j is safe in place: path[j] >= j, so a source is never an earlier destination.
  for (int j = 1; j <= k; ++j) {
    if (path[j] == j) continue;
    const int src = committed_len + path[j], dst = committed_len + j;
    for (KvPool* pool : pools) {
      pool->CopySlot(pages[src / ps], src % ps, pages[dst / ps], dst % ps);
    }
  }
  cache.Truncate(seq, committed_len + k + 1);
}

}  // namespace treespec
