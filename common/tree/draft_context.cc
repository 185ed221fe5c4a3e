#include "common/tree/draft_context.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace treespec {

void TargetFeatures::Append(const TargetFeatures& other) {
  if (other.empty()) return;
  if (empty()) width = other.width;
  rows += other.rows;
  bf16.insert(bf16.end(), other.bf16.begin(), other.bf16.end());
}

TargetFeatures SelectRows(const uint16_t* all, int width, size_t first_row,
                          absl::Span<const int> path) {
  TargetFeatures out;
  out.rows = static_cast<int>(path.size());
  out.width = out.rows > 0 ? width : 0;
  out.bf16.resize(static_cast<size_t>(out.rows) * width);
  for (int i = 0; i < out.rows; ++i) {
    std::copy_n(all + (first_row + path[i]) * width, width,
                out.bf16.data() + static_cast<size_t>(i) * width);
  }
  return out;
}

TargetFeatures SelectLayers(TargetFeatures rows, absl::Span<const int> have,
                            absl::Span<const int> want, int hidden) {
  if (std::equal(have.begin(), have.end(), want.begin(), want.end()) || rows.empty()) {
    return rows;
  }
  // Where each kept layer's block starts in a captured row.
  std::vector<size_t> from;
  from.reserve(want.size());
  for (int layer : want) {
    from.push_back(
        static_cast<size_t>(std::lower_bound(have.begin(), have.end(), layer) - have.begin()) *
        hidden);
  }
  TargetFeatures out;
  out.rows = rows.rows;
  out.width = static_cast<int>(want.size()) * hidden;
  out.bf16.resize(static_cast<size_t>(out.rows) * out.width);
  for (int r = 0; r < out.rows; ++r) {
    const uint16_t* in = rows.bf16.data() + static_cast<size_t>(r) * rows.width;
    uint16_t* to = out.bf16.data() + static_cast<size_t>(r) * out.width;
    for (size_t j = 0; j < from.size(); ++j) std::copy_n(in + from[j], hidden, to + j * hidden);
  }
  return out;
}

bool LayersInclude(absl::Span<const int> have, absl::Span<const int> want) {
  return std::includes(have.begin(), have.end(), want.begin(), want.end());
}

std::vector<int> LayersUnion(absl::Span<const int> a, absl::Span<const int> b) {
  std::vector<int> out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

bool LayersAscendingWithin(absl::Span<const int> layers, int num_layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] >= num_layers || (i > 0 && layers[i] <= layers[i - 1])) {
      return false;
    }
  }
  return true;
}

std::string FeatureSpecString(const FeatureSpec& spec) {
  if (spec.empty()) return "none";
  return absl::StrCat("layers [", absl::StrJoin(spec.layers, ", "), "] x hidden ", spec.hidden);
}

std::string FeatureTargetString(const FeatureSpec& spec) {
  return absl::StrCat("hidden ", spec.hidden, ", ", spec.num_layers, " layers, vocab ", spec.vocab);
}

absl::Status CheckFeatureTarget(const FeatureSpec& needs, int hidden, int num_layers, int vocab,
                                absl::string_view drafter) {
  if (needs.empty()) return absl::OkStatus();
  const FeatureSpec served{{}, hidden, num_layers, vocab};
  if (needs.hidden != hidden || needs.num_layers != num_layers || needs.vocab != vocab) {
    return absl::FailedPreconditionError(
        absl::StrCat(drafter, " was trained for a target of ", FeatureTargetString(needs),
                     "; this verifier serves ", FeatureTargetString(served),
                     ": pair it with the target it was trained for, or use another drafter kind"));
  }
  if (!LayersAscendingWithin(needs.layers, num_layers)) {
    return absl::FailedPreconditionError(
        absl::StrCat(drafter, " asks for target layers [", absl::StrJoin(needs.layers, ", "),
                     "], which are not strictly ascending within the target's ", num_layers));
  }
  return absl::OkStatus();
}

absl::Status CheckTargetFeatures(const TargetFeatures& features, absl::string_view field) {
  if (features.rows < 0 || features.width < 0 || (features.rows > 0) != (features.width > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", features.rows, " rows of width ",
                                                   features.width, " is not a shape"));
  }
  if (features.bf16.size() != static_cast<size_t>(features.rows) * features.width) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", features.bf16.size(),
                                                   " values for ", features.rows, " rows of width ",
                                                   features.width));
  }
  for (size_t i = 0; i < features.bf16.size(); ++i) {
    if ((features.bf16[i] & 0x7f80u) == 0x7f80u) {  // exponent all ones: inf or NaN
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": row ", i / features.width, " column ", i % features.width,
                       " is not finite (", (features.bf16[i] & 0x7fu) != 0 ? "NaN" : "inf",
                       "); the target's features must be finite bf16"));
    }
  }
  return absl::OkStatus();
}

}  // namespace treespec
