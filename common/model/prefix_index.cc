#include "common/model/prefix_index.h"

#include <algorithm>

#include "common/util/mix64.h"

namespace treespec {

uint64_t PrefixIndex::Key(uint64_t parent_key, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix64(parent_key);
  for (const int32_t t : tokens) h = Mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

int PrefixIndex::Find(uint64_t key, int parent, absl::Span<const int32_t> tokens) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const Entry& e = entries_[it->second];
  const bool same_parent =
      e.parent == parent && (parent < 0 || e.parent_generation == generation_[parent]);
  if (!same_parent || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
    return -1;
  }
  return it->second;
}

bool PrefixIndex::Insert(int page, uint64_t key, int parent, absl::Span<const int32_t> tokens) {
  if (!by_key_.emplace(key, page).second) return false;
  Entry& e = entries_[page];
  e.cached = true;
  e.key = key;
  e.parent = parent;
  e.parent_generation = parent >= 0 ? generation_[parent] : 0;
  e.tokens.assign(tokens.begin(), tokens.end());
  return true;
}

void PrefixIndex::Erase(int page) {
  Entry& e = entries_[page];
  if (!e.cached) return;
  by_key_.erase(e.key);
  e = Entry();
}

}  // namespace treespec
