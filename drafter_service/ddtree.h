// DDTree (DESIGN §4): the one best-first builder that turns ranked candidate children into the
// best draft tree under a node budget. Every drafter emits its tree through it.
//
// A prefix's score is the sum of the conditional log-probs along it (log of the product of
// probabilities). Because children are ranked by probability and log-probs are <= 0, a
// prefix never scores above its parent or its better-ranked sibling, so popping prefixes from a
// max-heap in score order — pushing, for each pop, its next sibling and its first child —
// yields the top-B prefixes, every parent before its children. Under per-depth marginals q_d
// this is the budget-B tree that maximises the expected accepted length. O(B log B) heap work.
#ifndef TREESPEC_DRAFTER_SERVICE_DDTREE_H_
#define TREESPEC_DRAFTER_SERVICE_DDTREE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/model/top_k.h"
#include "common/tree/token_tree.h"
#include "drafter_service/drafter.h"

namespace treespec {

// One ranked child of a prefix node.
struct Candidate {
  int32_t token = 0;
  float logprob = 0.0f;  // log p(token | prefix), <= 0
  // The source's handle for the prefix that ends with this child; passed back to Children()
  // to ask for its own children.
  int32_t key = 0;
};

// The first `k` of ranked (token, log-prob) pairs as candidates (keys 0: a CandidateSource sets
// its own).
std::vector<Candidate> CandidatesOf(absl::Span<const TokenLogProb> ranked, int k);

// Where the candidates come from: a trie (ngram), an expanded model tree (draft model), or
// per-depth marginals (DFlash).
class CandidateSource {
 public:
  virtual ~CandidateSource() = default;
  // Ranked children of the prefix `key` (logprob non-increasing; ties in the order the source
  // prefers). The span must stay valid until the build returns. Empty = a leaf.
  virtual absl::Span<const Candidate> Children(int32_t key) const = 0;
};

// Per-depth marginals: every node at depth d has the same ranked children q_{d+1}. Keys are
// depths; the root (the bonus) has key 0.
class PerDepthCandidates final : public CandidateSource {
 public:
  // ranked[d] = the ranked (token, logprob) list for depth d + 1; keys are filled in here.
  explicit PerDepthCandidates(std::vector<std::vector<Candidate>> ranked);
  absl::Span<const Candidate> Children(int32_t key) const override;

  // Ranks one depth's distribution: the top `k` (token, logprob) pairs of `logprobs` [vocab],
  // descending, lower token id first on ties (TopKLogProbs, common/model/top_k.h).
  static std::vector<Candidate> TopK(absl::Span<const float> logprobs, int k);

 private:
  std::vector<std::vector<Candidate>> ranked_;  // [depth][rank]
};

// Builds the tree of the top `limits.tree_budget` prefixes no deeper than `limits.max_depth`,
// starting from the children of `root_key`. Nodes come out in pop order (parents first) with
// their conditional log-probs. Ties on score are broken by (shallower first, then parent's
// output index, then rank), so the result is deterministic. Candidates with a log-prob of
// -inf (or NaN) are never drafted. When `keys` is given it receives each node's source key.
DraftedTree BuildDdTree(const CandidateSource& source, int32_t root_key, const SpecLimits& limits,
                        std::vector<int32_t>* keys = nullptr);

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DDTREE_H_
