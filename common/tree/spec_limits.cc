#include "common/tree/spec_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace treespec {
namespace {

absl::Status OutOfRange(absl::string_view name, int value, int low, int high,
                        absl::string_view extra = "") {
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be in [", low, ", ", high, "] (got ", value, ")", extra));
}

// A set (non-zero) field in [1, max], else an error naming it; an unset one becomes `fallback`.
absl::StatusOr<int> ResolveField(int asked, int fallback, int max, int low, absl::string_view name,
                                 absl::string_view limit_source) {
  if (asked == 0) return fallback;
  if (asked < low || asked > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", max, "] (got ", asked, ")",
                     limit_source.empty() ? "" : absl::StrCat("; ", max, " is ", limit_source),
                     "; 0 or unset = the server's default"));
  }
  return asked;
}

std::string Field(int value) { return value == 0 ? "unset" : absl::StrCat(value); }

}  // namespace

absl::Status ValidateSpecBounds(const SpecBounds& b, const SpecFlagNames& n) {
  const SpecLimits& c = kSpecCeiling;
  if (b.max.tree_budget < 1 || b.max.tree_budget > c.tree_budget) {
    return OutOfRange(n.max_tree_budget, b.max.tree_budget, 1, c.tree_budget);
  }
  if (b.max.max_depth < 1 || b.max.max_depth > c.max_depth) {
    return OutOfRange(n.max_depth_limit, b.max.max_depth, 1, c.max_depth);
  }
  if (b.max.top_k < 1 || b.max.top_k > c.top_k) {
    return OutOfRange(absl::StrCat("the largest ", n.top_k), b.max.top_k, 1, c.top_k);
  }
  if (b.defaults.tree_budget < 1 || b.defaults.tree_budget > b.max.tree_budget) {
    return OutOfRange(n.tree_budget, b.defaults.tree_budget, 1, b.max.tree_budget,
                      absl::StrCat(" (the upper end is ", n.max_tree_budget, ")"));
  }
  if (b.defaults.max_depth < 1 || b.defaults.max_depth > b.max.max_depth) {
    return OutOfRange(n.max_depth, b.defaults.max_depth, 1, b.max.max_depth);
  }
  if (b.defaults.top_k < 0 || b.defaults.top_k > b.max.top_k) {
    return OutOfRange(n.top_k, b.defaults.top_k, 0, b.max.top_k, "; 0 = the tree budget");
  }
  return absl::OkStatus();
}

absl::StatusOr<SpecLimits> ResolveSpecLimits(const SpecLimits& asked, const SpecBounds& bounds,
                                             absl::string_view field_prefix,
                                             const SpecLimitSources& sources) {
  const SpecLimits defaults = ClampSpecLimits(bounds.defaults, bounds.max);
  SpecLimits out;
  absl::StatusOr<int> v =
      ResolveField(asked.tree_budget, defaults.tree_budget, bounds.max.tree_budget, 1,
                   absl::StrCat(field_prefix, "tree_budget"), sources.tree_budget);
  if (!v.ok()) return v.status();
  out.tree_budget = *v;
  v = ResolveField(asked.max_depth, defaults.max_depth, bounds.max.max_depth, 1,
                   absl::StrCat(field_prefix, "max_depth"), sources.max_depth);
  if (!v.ok()) return v.status();
  out.max_depth = *v;
  v = ResolveField(asked.top_k, defaults.top_k, bounds.max.top_k, 1,
                   absl::StrCat(field_prefix, "top_k"), sources.top_k);
  if (!v.ok()) return v.status();
  out.top_k = *v;
  return out;
}

SpecLimits WithTreeBudget(const SpecLimits& session, int tree_budget) {
  SpecLimits out = session;
  if (tree_budget > 0) {
    out.tree_budget = std::min(out.tree_budget, tree_budget);
    out.top_k = std::min(out.top_k, out.tree_budget);
  }
  return out;
}

SpecLimits ClampSpecLimits(const SpecLimits& limits, const SpecLimits& max) {
  auto clamp = [](int value, int limit) { return value == 0 ? 0 : std::min(value, limit); };
  return SpecLimits{clamp(limits.tree_budget, max.tree_budget),
                    clamp(limits.max_depth, max.max_depth), clamp(limits.top_k, max.top_k)};
}

SpecLimits MaxSpecLimits(const SpecLimits& a, const SpecLimits& b) {
  return SpecLimits{std::max(a.tree_budget, b.tree_budget), std::max(a.max_depth, b.max_depth),
                    std::max(a.top_k, b.top_k)};
}

std::string SpecLimitsString(const SpecLimits& l) {
  return absl::StrCat("tree_budget ", Field(l.tree_budget), ", max_depth ", Field(l.max_depth),
                      ", top_k ", Field(l.top_k));
}

}  // namespace treespec
