// Prompt-lookup drafter (DESIGN §4), no model: match the longest suffix of the context against
// the context itself and draft what followed the earlier occurrences, branching where they
// disagree.
#ifndef TREESPEC_DRAFTER_SERVICE_NGRAM_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_NGRAM_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "drafter_service/drafter.h"

namespace treespec {

struct NgramOptions {
  int min_ngram = 1;         // shortest suffix worth matching
  int max_ngram = 4;         // longest suffix tried first
  int max_occurrences = 64;  // most recent earlier occurrences whose continuations are merged
};

// Checks the option ranges; the message names the bad field.
absl::Status ValidateNgramOptions(const NgramOptions& options);

// One request's context plus an index n-gram -> positions, updated on every Append, so a
// draft costs O(max_ngram + occurrences × depth) whatever the context length.
class NgramDraftSession final : public DraftSession {
 public:
  explicit NgramDraftSession(const NgramOptions& options);

  absl::Status Append(const DraftContext& added) override;
  // Trie of the continuations that followed the most recent occurrences of the longest
  // matching suffix: p(child | node) = count(child) / count(node), ranked by count, then by
  // recency. Empty when no suffix of length >= min_ngram occurred before.
  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override;

  int64_t context_size() const { return static_cast<int64_t>(context_.size()); }

 private:
  // Hash of context_[end - n, end), accumulated from the last token backwards.
  uint64_t SuffixHash(int64_t end, int n) const;
  // True when context_[a - n, a) == context_[b - n, b).
  bool SameNgram(int64_t a, int64_t b, int n) const;

  const NgramOptions options_;
  std::vector<int32_t> context_;
  // index_[n - min_ngram]: hash of an n-gram -> the positions right after each occurrence
  // (ascending). Hash collisions are resolved by comparing tokens on lookup.
  std::vector<absl::flat_hash_map<uint64_t, std::vector<int32_t>>> index_;
};

class NgramDrafterFactory final : public DrafterFactory {
 public:
  explicit NgramDrafterFactory(const NgramOptions& options) : options_(options) {}
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;

 private:
  const NgramOptions options_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_NGRAM_DRAFTER_H_
