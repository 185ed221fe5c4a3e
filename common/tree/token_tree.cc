#include "common/tree/token_tree.h"

#include <algorithm>
#include <cstddef>

#include "absl/strings/str_cat.h"

namespace treespec {

absl::Status ValidateDraftedTree(const DraftedTree& tree, int vocab_size, int max_nodes,
                                 int max_depth) {
  const size_t m = tree.tokens.size();
  if (tree.parents.size() != m) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft tree has ", m, " tokens but ", tree.parents.size(),
                     " parents; both lists must have one entry per drafted node"));
  }
  if (!tree.logprobs.empty() && tree.logprobs.size() != m) {
    return absl::InvalidArgumentError(absl::StrCat("draft tree has ", m, " tokens but ",
                                                   tree.logprobs.size(),
                                                   " logprobs; send one per drafted node or none"));
  }
  if (static_cast<int64_t>(m) > max_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft tree has ", m, " nodes, more than the budget of ", max_nodes));
  }
  // depth[j] of drafted entry j: 1 for children of the bonus.
  std::vector<int32_t> depth(m);
  for (size_t j = 0; j < m; ++j) {
    const int32_t token = tree.tokens[j];
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("draft tree node ", j, ": token id ", token,
                                                     " out of range [0, ", vocab_size, ")"));
    }
    const int32_t parent = tree.parents[j];
    if (parent < -1 || parent >= static_cast<int32_t>(j)) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft tree node ", j, ": parent ", parent,
                       " is not before the node (must be -1 for the bonus or in [0, ", j, "))"));
    }
    depth[j] = parent < 0 ? 1 : depth[parent] + 1;
    if (depth[j] > max_depth) {
      return absl::InvalidArgumentError(absl::StrCat("draft tree node ", j, ": depth ", depth[j],
                                                     " exceeds max_depth ", max_depth));
    }
  }
  return absl::OkStatus();
}

void ToVerifyTree(int32_t bonus, const DraftedTree& drafted, std::vector<int32_t>* tokens,
                  std::vector<int32_t>* parents) {
  const size_t m = drafted.tokens.size();
  tokens->resize(m + 1);
  parents->resize(m + 1);
  (*tokens)[0] = bonus;
  (*parents)[0] = -1;
  for (size_t j = 0; j < m; ++j) {
    (*tokens)[j + 1] = drafted.tokens[j];
    (*parents)[j + 1] = drafted.parents[j] + 1;  // -1 (the bonus) becomes node 0
  }
}

std::vector<std::vector<int32_t>> DraftedPaths(const DraftedTree& tree) {
  std::vector<std::vector<int32_t>> paths(tree.tokens.size());
  for (size_t j = 0; j < tree.tokens.size(); ++j) {
    if (tree.parents[j] >= 0) paths[j] = paths[tree.parents[j]];
    paths[j].push_back(tree.tokens[j]);
  }
  return paths;
}

std::vector<int32_t> NodeDepths(absl::Span<const int32_t> parents) {
  std::vector<int32_t> depth(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    depth[i] = parents[i] < 0 ? 0 : depth[parents[i]] + 1;
  }
  return depth;
}

std::vector<uint64_t> AllVisibleMask(int n) {
  const int words = (n + 63) / 64;
  std::vector<uint64_t> mask(static_cast<size_t>(n) * words, ~uint64_t{0});
  if (n % 64 != 0) {
    for (int i = 0; i < n; ++i) mask[static_cast<size_t>(i) * words + words - 1] >>= 64 - n % 64;
  }
  return mask;
}

std::vector<uint64_t> AncestorMask(absl::Span<const int32_t> parents) {
  const size_t n = parents.size();
  const size_t words = (n + 63) / 64;
  std::vector<uint64_t> mask(n * words, 0);
  for (size_t i = 0; i < n; ++i) {
    uint64_t* row = mask.data() + i * words;
    if (parents[i] >= 0) {
      // Parents precede children, so the parent's row is complete.
      const uint64_t* parent_row = mask.data() + static_cast<size_t>(parents[i]) * words;
      std::copy(parent_row, parent_row + words, row);
    }
    row[i / 64] |= uint64_t{1} << (i % 64);
  }
  return mask;
}

std::vector<int32_t> WalkTree(absl::Span<const int32_t> tokens, absl::Span<const int32_t> parents,
                              absl::Span<const int32_t> choice) {
  std::vector<int32_t> path;
  if (tokens.empty()) return path;
  path.push_back(0);
  int32_t cur = 0;
  // Children come after their parent, and the next accepted node comes after the current one,
  // so one forward scan finds the whole path: O(n).
  for (size_t j = 1; j < tokens.size(); ++j) {
    if (parents[j] == cur && tokens[j] == choice[cur]) {
      cur = static_cast<int32_t>(j);
      path.push_back(cur);
    }
  }
  return path;
}

}  // namespace treespec
