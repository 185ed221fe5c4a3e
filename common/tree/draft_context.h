// What a commit adds to a drafting session's context, on both sides of the wire: the tokens,
// and for a drafter conditioned on the target (DFlash) the target's features of those tokens.
//
// Features lag the tokens by one. A context's last token is the pending bonus, which the target
// has not run yet, so a commit's rows are the features of the context tokens before its last
// token that no earlier commit carried: commit 0 (after prefill; its one token is the first
// bonus) carries a row per prompt token, and every later commit a row per token it carries (the
// previous bonus and the accepted tokens, computed by the verify step that accepted them). After
// any commit, a session that takes features holds a row for every context token but the last.
#ifndef TREESPEC_COMMON_TREE_DRAFT_CONTEXT_H_
#define TREESPEC_COMMON_TREE_DRAFT_CONTEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace treespec {

// Rows of target features: per token, the hidden states after each captured layer, side by
// side (layer-major within a row), as bf16 bit patterns.
struct TargetFeatures {
  int rows = 0;
  int width = 0;               // captured layers × hidden size; 0 when rows is 0
  std::vector<uint16_t> bf16;  // [rows, width] row-major

  bool empty() const { return rows == 0; }
  // Appends `other`'s rows (same width, or either empty).
  void Append(const TargetFeatures& other);
};

// Rows first_row + path[i] of `all` ([rows, width] bf16 bits, row-major), in path order: the
// rows a verify step keeps of one batch entry whose first row is `first_row`.
TargetFeatures SelectRows(const uint16_t* all, int width, size_t first_row,
                          absl::Span<const int> path);

// The blocks of layers `want` of rows that carry layers `have` (both strictly ascending, `want`
// a subset of `have`; rows are layer-major, `hidden` values per layer): what a consumer that
// reads fewer layers than were captured keeps. `rows` itself when the two lists are equal.
TargetFeatures SelectLayers(TargetFeatures rows, absl::Span<const int> have,
                            absl::Span<const int> want, int hidden);
// True when every layer of `want` is in `have` (both ascending).
bool LayersInclude(absl::Span<const int> have, absl::Span<const int> want);
// The sorted union of two ascending layer lists.
std::vector<int> LayersUnion(absl::Span<const int> a, absl::Span<const int> b);

// True when `layers` are strictly ascending within [0, num_layers).
bool LayersAscendingWithin(absl::Span<const int> layers, int num_layers);

// What a drafter conditioned on the target needs from it: the layers whose outputs (the
// residual stream after layer l, Transformers' hidden_states[l + 1]) make a feature row, and
// the shape of the target it was trained for. Empty layers: the drafter reads tokens only.
struct FeatureSpec {
  std::vector<int> layers;
  int hidden = 0;      // the target's hidden size: a row is layers × hidden wide
  int num_layers = 0;  // the target's layer count
  int vocab = 0;       // the target's vocabulary (the drafter uses its embedding and head)

  bool empty() const { return layers.empty(); }
  int width() const { return static_cast<int>(layers.size()) * hidden; }
  friend bool operator==(const FeatureSpec&, const FeatureSpec&) = default;
};

// "layers [1, 3] x hidden 256", or "none".
std::string FeatureSpecString(const FeatureSpec& spec);
// "hidden 256, 6 layers, vocab 4096".
std::string FeatureTargetString(const FeatureSpec& spec);

// OK when `needs` is empty or was made for a target of this shape (and its layers are
// strictly ascending within it); else FailedPrecondition naming both shapes and `drafter`.
absl::Status CheckFeatureTarget(const FeatureSpec& needs, int hidden, int num_layers, int vocab,
                                absl::string_view drafter);

struct DraftContext {
  std::vector<int32_t> tokens;
  TargetFeatures features;
};

// A context addition of tokens alone.
inline DraftContext TokenContext(absl::Span<const int32_t> tokens) {
  return {{tokens.begin(), tokens.end()}, {}};
}

// OK when the shape is consistent (rows, width >= 0; width > 0 iff rows > 0; bf16 holds
// rows × width values) and every value is finite; else InvalidArgument naming `field`.
absl::Status CheckTargetFeatures(const TargetFeatures& features, absl::string_view field);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TREE_DRAFT_CONTEXT_H_
