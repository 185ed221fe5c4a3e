#include "common/tokenizer/bpe.h"

#include <mutex>
#include <queue>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace treespec {
namespace {

// Cache entries across all shards; a few MiB at typical piece lengths.
constexpr size_t kCacheCapacity = 1 << 16;

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool live;     // false once merged into the symbol on its left
};

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t new_id;
};

// Lowest rank first, then leftmost: the order Hugging Face's Merge implements with Ord.
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

// The Debian Abseil's string_view is its own type, not std::string_view; its hash maps take
// only that one for heterogeneous lookup.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

BpeCache::BpeCache(size_t capacity) : capacity_per_shard_(capacity / kShards + 1) {}

bool BpeCache::Lookup(std::string_view piece, std::vector<int32_t>* ids) const {
  const Shard& shard = shards_[absl::Hash<absl::string_view>{}(AbslView(piece)) % kShards];
  std::shared_lock lock(shard.mu);
  const auto it = shard.map.find(AbslView(piece));
  if (it == shard.map.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::Insert(std::string_view piece, const int32_t* ids, size_t count) {
  Shard& shard = shards_[absl::Hash<absl::string_view>{}(AbslView(piece)) % kShards];
  std::unique_lock lock(shard.mu);
  if (shard.map.size() >= capacity_per_shard_) shard.map.clear();
  shard.map.try_emplace(std::string(piece), ids, ids + count);
}

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> vocab,
                   absl::flat_hash_map<uint64_t, BpeMerge> merges, BpeOptions options)
    : vocab_(std::move(vocab)),
      merges_(std::move(merges)),
      options_(options),
      cache_(kCacheCapacity) {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    const auto it = vocab_.find(AbslView(piece));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1 && byte_ids_[static_cast<uint8_t>(piece[0])] >= 0) {
    ids->push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable && cache_.Lookup(piece, ids)) return;
  const size_t first = ids->size();
  Merge(piece, ids);
  if (cacheable) cache_.Insert(piece, ids->data() + first, ids->size() - first);
}

void BpeModel::Merge(std::string_view piece, std::vector<int32_t>* ids) const {
  // One symbol per byte (Hugging Face: per character of the byte-level spelling, which is one
  // character per byte). Unknown bytes become unk (fused if asked) or vanish, as there.
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  int32_t pending_unk = -1;  // a pending (possibly fused) unk symbol not yet added
  auto add = [&symbols](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, true});
    if (index > 0) symbols[index - 1].next = index;
  };
  for (const char ch : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(id);
    } else if (options_.unk_id >= 0) {
      if (pending_unk >= 0 && !options_.fuse_unk) add(pending_unk);
      pending_unk = options_.unk_id;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  auto find_merge = [this](int32_t left, int32_t right) -> const BpeMerge* {
    const auto it = merges_.find(PairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(symbols.size());
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateAfter> queue(
      CandidateAfter{}, std::move(heap_storage));
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const BpeMerge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.live || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Entries go stale when a neighbour merged first; Hugging Face checks staleness by the
    // merge result alone, and so do we, to give the very same ids.
    const BpeMerge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.live = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const BpeMerge* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const BpeMerge* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push({m->rank, top.pos, m->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.live) ids->push_back(s.id);
  }
}

}  // namespace treespec
