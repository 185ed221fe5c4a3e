#include "drafter_service/ngram_drafter.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/mix64.h"
#include "drafter_service/ddtree.h"

namespace treespec {
namespace {

// The running hash `h` extended by `token`.
uint64_t Mix(uint64_t h, int32_t token) {
  return Mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + kGolden64));
}

// Continuations merged into a trie; node 0 is the bonus. Keys are node indices.
class ContinuationTrie final : public CandidateSource {
 public:
  explicit ContinuationTrie(int num_sequences) { nodes_.push_back(Node{-1, num_sequences, {}}); }

  void Insert(absl::Span<const int32_t> continuation) {
    int32_t cur = 0;
    for (int32_t token : continuation) {
      int32_t next = -1;
      for (int32_t child : nodes_[cur].children) {
        if (nodes_[child].token == token) {
          next = child;
          break;
        }
      }
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{token, 0, {}});
        nodes_[cur].children.push_back(next);  // first seen = most recent: keeps rank order
      }
      ++nodes_[next].count;
      cur = next;
    }
  }

  // Turns counts into ranked candidates; call once after the last Insert.
  void Rank() {
    ranked_.assign(nodes_.size(), {});
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::vector<int32_t> kids = nodes_[i].children;
      // Stable: equal counts stay in order of first sight, i.e. most recent first.
      std::stable_sort(kids.begin(), kids.end(),
                       [this](int32_t a, int32_t b) { return nodes_[a].count > nodes_[b].count; });
      const double parent_count = nodes_[i].count;
      for (int32_t k : kids) {
        const float lp = static_cast<float>(std::log(nodes_[k].count / parent_count));
        ranked_[i].push_back(Candidate{nodes_[k].token, std::min(lp, 0.0f), k});
      }
    }
  }

  absl::Span<const Candidate> Children(int32_t key) const override { return ranked_[key]; }

 private:
  struct Node {
    int32_t token;
    int32_t count;                  // continuations through this node
    std::vector<int32_t> children;  // node indices, in order of first sight
  };
  std::vector<Node> nodes_;
  std::vector<std::vector<Candidate>> ranked_;  // [node][rank]
};

}  // namespace

absl::Status ValidateNgramOptions(const NgramOptions& options) {
  if (options.min_ngram < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ngram min_ngram must be >= 1, got ", options.min_ngram));
  }
  if (options.max_ngram < options.min_ngram) {
    return absl::InvalidArgumentError(absl::StrCat("ngram max_ngram (", options.max_ngram,
                                                   ") must be >= min_ngram (", options.min_ngram,
                                                   ")"));
  }
  if (options.max_occurrences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ngram max_occurrences must be >= 1, got ", options.max_occurrences));
  }
  return absl::OkStatus();
}

NgramDraftSession::NgramDraftSession(const NgramOptions& options)
    : options_(options), index_(std::max(0, options.max_ngram - options.min_ngram + 1)) {}

uint64_t NgramDraftSession::SuffixHash(int64_t end, int n) const {
  uint64_t h = static_cast<uint64_t>(n);
  for (int i = 1; i <= n; ++i) h = Mix(h, context_[end - i]);
  return h;
}

bool NgramDraftSession::SameNgram(int64_t a, int64_t b, int n) const {
  return std::equal(context_.begin() + (a - n), context_.begin() + a, context_.begin() + (b - n));
}

absl::Status NgramDraftSession::Append(const DraftContext& added) {
  for (int32_t token : added.tokens) {
    context_.push_back(token);
    const int64_t end = static_cast<int64_t>(context_.size());
    for (int n = options_.min_ngram; n <= options_.max_ngram && n <= end; ++n) {
      index_[n - options_.min_ngram][SuffixHash(end, n)].push_back(static_cast<int32_t>(end));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DraftedTree> NgramDraftSession::Draft(const SpecLimits& limits) {
  const int64_t size = static_cast<int64_t>(context_.size());
  if (limits.tree_budget <= 0 || limits.max_depth <= 0) return DraftedTree{};

  // Positions right after earlier occurrences of the longest matching suffix, newest first.
  std::vector<int32_t> starts;
  for (int n = static_cast<int>(std::min<int64_t>(options_.max_ngram, size - 1));
       n >= options_.min_ngram && starts.empty(); --n) {
    auto it = index_[n - options_.min_ngram].find(SuffixHash(size, n));
    if (it == index_[n - options_.min_ngram].end()) continue;
    const std::vector<int32_t>& ends = it->second;
    for (auto e = ends.rbegin(); e != ends.rend(); ++e) {
      // The suffix itself (end == size) has no continuation yet.
      if (*e >= size || !SameNgram(*e, size, n)) continue;
      starts.push_back(*e);
      if (static_cast<int>(starts.size()) == options_.max_occurrences) break;
    }
  }
  if (starts.empty()) return DraftedTree{};

  ContinuationTrie trie(static_cast<int>(starts.size()));
  std::vector<int32_t> continuation(limits.max_depth);
  for (int32_t start : starts) {
    // If the text after `start` repeats after the suffix, then once the copy reaches the
    // context's end it continues with itself: the continuation has period size - start.
    const int64_t period = size - start;
    for (int k = 0; k < limits.max_depth; ++k) {
      continuation[k] = start + k < size ? context_[start + k] : continuation[k - period];
    }
    trie.Insert(continuation);
  }
  trie.Rank();
  return BuildDdTree(trie, 0, limits);
}

absl::StatusOr<std::unique_ptr<DraftSession>> NgramDrafterFactory::NewSession() {
  return std::make_unique<NgramDraftSession>(options_);
}

}  // namespace treespec
