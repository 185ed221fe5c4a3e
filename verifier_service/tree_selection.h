// Which drafted nodes a verify step verifies (issue 34): from every ready request's drafted
// tree, the prefix-closed node sets that maximise the step's expected tokens per second under
// the step-cost model (step_cost_model.h), possibly none at all when the verifier is saturated.
//
// A node is accepted when the target agrees with its whole path, so under the drafter's own
// factorised model its chance is the product of the drafter's conditional probabilities along
// the path (exp of the summed log-probs). Small drafters are over-confident, so that product is
// calibrated per drafter kind and depth against what verification accepts
// (AcceptanceCalibration). A step over B requests that keeps nodes with calibrated chances p
// emits B + Σ p tokens on average (every request gets the target's own token after its accepted
// path); the selection adds nodes in order of falling chance and keeps the prefix of that order
// with the most tokens per predicted millisecond.
#ifndef TREESPEC_VERIFIER_SERVICE_TREE_SELECTION_H_
#define TREESPEC_VERIFIER_SERVICE_TREE_SELECTION_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "common/tree/drafter_kind.h"
#include "common/tree/token_tree.h"
#include "verifier_service/step_cost_model.h"

namespace treespec {

// Each drafted node's chance of acceptance under the drafter's model: the product of
// exp(logprob) along its path. A tree without log-probs (the n-gram drafter's) shares each
// parent's chance equally among its children. [tree.tokens.size()]
std::vector<double> PathProbabilities(const DraftedTree& tree);

// Whose drafts a calibration is for: a drafter kind, or nullopt for AUTO sessions (the pool's
// default kind, unknown to the verifier).
using DraftSourceKind = std::optional<DrafterKind>;
// DraftSourceKind's values as 0 .. kNumDraftSources - 1: DrafterKind's order, then AUTO; and
// the name of each ("ngram", ..., "auto"), for keys, arrays and metric labels.
inline constexpr int kNumDraftSources = kNumDrafterKinds + 1;
int DraftSourceIndex(DraftSourceKind kind);
const char* DraftSourceName(int index);

// How a drafter kind's path probabilities compare with what verification accepts, per depth:
// the factor is (decayed count of steps that accepted a node at depth d) / (decayed sum of the
// verified depth-d nodes' path probabilities), starting at 1 and kept within [1/16, 16].
// Engine thread only.
class AcceptanceCalibration {
 public:
  static constexpr int kMaxDepth = 64;  // the protocol's deepest tree (kSpecCeiling)
  // Each observation keeps this share of the old counts (an exponential average over about
  // 1 / (1 - kDecay) steps).
  static constexpr double kDecay = 0.98;

  // The calibrated chance of a node at `depth` (>= 1) whose path probability is `p`, in [0, 1].
  double Calibrated(DraftSourceKind kind, int depth, double p) const;
  double Factor(DraftSourceKind kind, int depth) const;
  // A verified tree's drafted nodes (their depths and path probabilities) and the depth of the
  // deepest node the step accepted (0: none).
  void Observe(DraftSourceKind kind, absl::Span<const int> depths, absl::Span<const double> probs,
               int accepted_depth);

 private:
  struct Counts {
    double predicted = 1;  // a prior of one step that predicted what it accepted
    double accepted = 1;
  };
  std::array<std::array<Counts, kMaxDepth + 1>, kNumDraftSources> counts_{};
};

// One ready request's draft, as the selection sees it.
struct SelectionCandidate {
  const DraftedTree* tree = nullptr;  // null or empty: the request verifies its bonus alone
  int committed_len = 0;              // tokens in its KV cache
  int cap = 0;                        // most drafted nodes to keep (its own tree_budget)
  DraftSourceKind kind;
};

struct TreeSelection {
  // Per candidate, the kept drafted nodes (indices into its tree, ascending; a kept node's
  // parent is kept), and parallel to them each one's depth (>= 1) and path probability under
  // the drafter (PathProbabilities, uncalibrated: what AcceptanceCalibration::Observe takes).
  std::vector<std::vector<int>> keep;
  std::vector<std::vector<int>> kept_depths;
  std::vector<std::vector<double>> kept_probs;
  std::vector<double> expected;  // per candidate: Σ calibrated chances of its kept nodes
  // B + Σ calibrated chances of the kept nodes (+ a token per prefilled prompt)
  double expected_tokens = 0;
  double predicted_ms = 0;  // the step-cost model's time for the step, prefills included
};

// Prompts prefilled in the same step as the candidates' verify trees: their rows make the step
// dearer and each node's marginal cost that of a larger step (a prompt of n tokens is costed as
// a sequence with n - 1 drafted nodes and no context, each emitting one token).
struct PrefillLoad {
  int sequences = 0;
  int64_t rows = 0;  // prompt tokens, summed
};

TreeSelection SelectNodes(absl::Span<const SelectionCandidate> candidates,
                          const StepCostModel& cost, const AcceptanceCalibration& calibration,
                          const PrefillLoad& prefill = {});

// `tree` restricted to `keep` (ascending, prefix-closed), parents renumbered.
DraftedTree KeepNodes(const DraftedTree& tree, absl::Span<const int> keep);

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_TREE_SELECTION_H_
