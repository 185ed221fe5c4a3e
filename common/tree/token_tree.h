// Token trees as drafted and verified (DESIGN §3): node 0 is the bonus token, nodes 1..n-1 are
// drafted, parents precede children.
#ifndef TREESPEC_COMMON_TREE_TOKEN_TREE_H_
#define TREESPEC_COMMON_TREE_TOKEN_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace treespec {

// Drafted nodes only, as in the DraftTree message: entry j is tree node j+1, parents[j] is a
// drafted-entry index < j or -1 for the bonus.
struct DraftedTree {
  std::vector<int32_t> tokens;    // [m]
  std::vector<int32_t> parents;   // [m]
  std::vector<float> logprobs;    // [m] draft log-prob given the parent (may be empty)
};

// Checks a drafted tree from a drafter: sizes agree, parents[j] in [-1, j), token ids in
// [0, vocab_size), m <= max_nodes, depth <= max_depth. The message says what is wrong.
absl::Status ValidateDraftedTree(const DraftedTree& tree, int vocab_size, int max_nodes,
                                 int max_depth);

// Full verify tree: node 0 = bonus, node j+1 = drafted entry j. tokens/parents [m + 1].
void ToVerifyTree(int32_t bonus, const DraftedTree& drafted, std::vector<int32_t>* tokens,
                  std::vector<int32_t>* parents);

// Token path from the bonus (excluded) to each drafted node: [m][depth of the node].
std::vector<std::vector<int32_t>> DraftedPaths(const DraftedTree& tree);

// depth[i] of each node (node 0 has depth 0). [n]
std::vector<int32_t> NodeDepths(absl::Span<const int32_t> parents);

// Ancestor bitmask: row i has bit j set iff j is i or an ancestor of i.
// [n, words_per_row] with words_per_row = ceil(n / 64).
std::vector<uint64_t> AncestorMask(absl::Span<const int32_t> parents);
// The same layout with bits 0..n-1 of every row set: every node sees all n nodes (a
// bidirectional block, SeqTree::bidirectional).
std::vector<uint64_t> AllVisibleMask(int n);

// The walk (DESIGN §3 step 4): from node 0, move to the child whose token equals choice[cur];
// returns the accepted path [0, c1, ..., ck]. The emitted tokens are tokens[c1..ck] followed by
// choice[ck] (the next bonus). When several children carry the same token the first wins.
std::vector<int32_t> WalkTree(absl::Span<const int32_t> tokens,
                              absl::Span<const int32_t> parents,
                              absl::Span<const int32_t> choice);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TREE_TOKEN_TREE_H_
