// Speculation limits — tree budget, depth, top-k — as one type both services use, with one
// convention for "unset" (0, proto3's default for a scalar: the wire, the flags and the options
// agree), one check of a service's configured bounds and one resolution of a request against
// them. The drafter owns its maxima (its flags) and states them to the verifier
// (Drafter.GetInfo, and the DraftOpened answer of every session); the verifier clamps to them.
#ifndef TREESPEC_COMMON_TREE_SPEC_LIMITS_H_
#define TREESPEC_COMMON_TREE_SPEC_LIMITS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace treespec {

struct SpecLimits {
  int tree_budget = 0;  // drafted nodes per tree, the bonus token excluded; 0 = unset
  int max_depth = 0;    // deepest drafted node (the bonus is depth 0); 0 = unset
  // Candidates a drafter ranks per expanded node (the draft model's children per node); 0 =
  // unset, which a drafter reads as the tree budget (every node could be a child of one).
  int top_k = 0;

  friend bool operator==(const SpecLimits&, const SpecLimits&) = default;
};

// The protocol's own maxima: any service's configured maximum lies within them. 1024 nodes
// bounds a tree's ancestor masks at 16 words per node; 64 levels bound a walk's path.
inline constexpr SpecLimits kSpecCeiling{1024, 64, 1024};

// What a service serves: the defaults that fill unset fields, and its largest values. The largest
// tree is 512 nodes: DDTree's speedup peaks at 256-512 nodes (arXiv 2604.12989).
struct SpecBounds {
  SpecLimits defaults{16, 8, 0};  // top_k 0: the tree budget
  SpecLimits max{512, kSpecCeiling.max_depth, 512};
};

// The flag names ValidateSpecBounds reports (services spell their flags alike; options set in
// code without a flag carry a descriptive name instead).
struct SpecFlagNames {
  std::string tree_budget = "--tree_budget";
  std::string max_tree_budget = "--max_tree_budget";
  std::string max_depth = "--max_depth";
  std::string max_depth_limit = "max_depth_limit";
  std::string top_k = "--top_k";
};

// OK, or InvalidArgument naming the flag: every maximum in [1, kSpecCeiling], the default tree
// budget and depth in [1, maximum], the default top_k in [0, max top_k] (0 = the tree budget).
absl::Status ValidateSpecBounds(const SpecBounds& bounds, const SpecFlagNames& names = {});

// What sets each maximum, for messages (e.g. "the largest --max_tree_budget of the drafters");
// empty: not said.
struct SpecLimitSources {
  std::string tree_budget, max_depth, top_k;
};

// `asked` with its unset fields filled from bounds.defaults, each default first clamped to
// bounds.max. A set field must lie in [1, bounds.max]; else InvalidArgument naming
// `field_prefix` + the field, the value, the limit and what sets it.
absl::StatusOr<SpecLimits> ResolveSpecLimits(const SpecLimits& asked, const SpecBounds& bounds,
                                             absl::string_view field_prefix,
                                             const SpecLimitSources& sources = {});

// Each field of `limits` at most the same field of `max` (unset fields stay unset).
SpecLimits ClampSpecLimits(const SpecLimits& limits, const SpecLimits& max);

// A session's limits for one tree whose commit asked for at most `tree_budget` nodes (0: no
// ask): the budget lowered to it, and the children per node with it.
SpecLimits WithTreeBudget(const SpecLimits& session, int tree_budget);

// Each field the larger of the two: the maxima of a pool that holds both.
SpecLimits MaxSpecLimits(const SpecLimits& a, const SpecLimits& b);

// "tree_budget 16, max_depth 8, top_k 16" (0 printed as "unset"), for logs and messages.
std::string SpecLimitsString(const SpecLimits& limits);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TREE_SPEC_LIMITS_H_
