// The BPE model of a byte-level tokenizer.json: turns one pre-tokenized piece into ids by
// repeatedly applying the lowest-ranked merge (leftmost first on ties), exactly as Hugging
// Face's Word::merge_all does, with a heap: O(n log n) in the piece length.
#ifndef TREESPEC_COMMON_TOKENIZER_BPE_H_
#define TREESPEC_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace treespec {

struct BpeOptions {
  // A piece that is itself a vocabulary entry becomes that token without merging (Llama 3).
  bool ignore_merges = false;
  int32_t unk_id = -1;    // id for bytes missing from the vocabulary; -1: such bytes are dropped
  bool fuse_unk = false;  // consecutive unknown bytes become one unk token
};

// The result of merging the pair of symbols (left, right).
struct BpeMerge {
  int32_t rank;    // position in the merges list: lower merges first
  int32_t new_id;  // the id of the concatenation
};

// A bounded cache of piece -> ids, shared by all threads. Sharded so that concurrent encodes
// rarely contend; a full shard is cleared rather than evicted entry by entry (cheap, and a
// working set that fits comes back within a few calls).
class BpeCache {
 public:
  explicit BpeCache(size_t capacity);
  // Appends the cached ids of `piece` to `ids`; false when absent.
  bool Lookup(std::string_view piece, std::vector<int32_t>* ids) const;
  void Insert(std::string_view piece, const int32_t* ids, size_t count);

 private:
  static constexpr int kShards = 16;
  struct Shard {
    mutable std::shared_mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> map;  // guarded by mu
  };
  size_t capacity_per_shard_;
  std::array<Shard, kShards> shards_;
};

class BpeModel {
 public:
  // `vocab` maps raw byte strings (token strings with the byte-level mapping undone) to ids;
  // `merges` maps PairKey(left id, right id) to the merge.
  BpeModel(absl::flat_hash_map<std::string, int32_t> vocab,
           absl::flat_hash_map<uint64_t, BpeMerge> merges, BpeOptions options);

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  // Appends the ids of one piece (raw bytes). Thread-safe.
  void Encode(std::string_view piece, std::vector<int32_t>* ids) const;

 private:
  // The merge loop proper, without the cache.
  void Merge(std::string_view piece, std::vector<int32_t>* ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, BpeMerge> merges_;
  BpeOptions options_;
  std::array<int32_t, 256> byte_ids_;  // id of each single byte, -1 when not in the vocab
  // Pieces longer than this are merged every time: they are rare, and would crowd the cache.
  static constexpr size_t kMaxCachedPieceBytes = 256;
  mutable BpeCache cache_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_BPE_H_
