#include "verifier_service/tree_selection.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace treespec {
namespace {

constexpr double kMinFactor = 1.0 / 16, kMaxFactor = 16;

}  // namespace

int DraftSourceIndex(DraftSourceKind kind) {
  return kind.has_value() ? static_cast<int>(*kind) : kNumDrafterKinds;
}

const char* DraftSourceName(int index) {
  return index < kNumDrafterKinds ? AllDrafterKinds()[index].name : "auto";
}

std::vector<double> PathProbabilities(const DraftedTree& tree) {
  const size_t m = tree.tokens.size();
  std::vector<double> p(m, 0);
  if (tree.logprobs.size() == m) {
    for (size_t j = 0; j < m; ++j) {
      const double parent = tree.parents[j] < 0 ? 1.0 : p[tree.parents[j]];
      p[j] = parent * std::exp(static_cast<double>(tree.logprobs[j]));
    }
    return p;
  }
  // Without log-probs: each parent's chance shared equally by its children (the bonus, -1,
  // is the parent of the roots).
  std::vector<int> children(m + 1, 0);
  for (size_t j = 0; j < m; ++j) ++children[tree.parents[j] + 1];
  for (size_t j = 0; j < m; ++j) {
    const double parent = tree.parents[j] < 0 ? 1.0 : p[tree.parents[j]];
    p[j] = parent / children[tree.parents[j] + 1];
  }
  return p;
}

double AcceptanceCalibration::Factor(DraftSourceKind kind, int depth) const {
  const Counts& c = counts_[DraftSourceIndex(kind)][std::clamp(depth, 0, kMaxDepth)];
  return std::clamp(c.accepted / c.predicted, kMinFactor, kMaxFactor);
}

double AcceptanceCalibration::Calibrated(DraftSourceKind kind, int depth, double p) const {
  return std::clamp(Factor(kind, depth) * p, 0.0, 1.0);
}

void AcceptanceCalibration::Observe(DraftSourceKind kind, absl::Span<const int> depths,
                                    absl::Span<const double> probs, int accepted_depth) {
  std::array<double, kMaxDepth + 1> predicted{};
  int deepest = 0;
  for (size_t j = 0; j < depths.size() && j < probs.size(); ++j) {
    const int d = std::clamp(depths[j], 1, kMaxDepth);
    predicted[d] += probs[j];
    deepest = std::max(deepest, d);
  }
  // Only the depths the tree reached say anything: a depth without nodes could not accept.
  for (int d = 1; d <= deepest; ++d) {
    Counts& c = counts_[DraftSourceIndex(kind)][d];
    c.predicted = kDecay * c.predicted + predicted[d];
    c.accepted = kDecay * c.accepted + (accepted_depth >= d ? 1.0 : 0.0);
  }
}

TreeSelection SelectNodes(absl::Span<const SelectionCandidate> candidates,
                          const StepCostModel& cost, const AcceptanceCalibration& calibration,
                          const PrefillLoad& prefill) {
  TreeSelection out;
  out.keep.resize(candidates.size());
  out.kept_depths.resize(candidates.size());
  out.kept_probs.resize(candidates.size());
  out.expected.assign(candidates.size(), 0.0);
  const int batch = static_cast<int>(candidates.size());
  if (batch == 0) return out;
  // The step's shape with k drafted nodes kept: the prompts are sequences of their own.
  const int sequences = batch + prefill.sequences;
  double context = 0;
  for (const SelectionCandidate& c : candidates) context += c.committed_len;
  context /= sequences;
  const double prompt_nodes = static_cast<double>(prefill.rows - prefill.sequences);
  auto step_ms = [&](size_t k) {
    return cost.PredictMs(
        {sequences, (static_cast<double>(k) + prompt_nodes) / sequences, context});
  };

  // Every drafted node with its calibrated chance, made non-increasing along each path (a node
  // is accepted only with its parent), so that falling chance with rising depth on ties puts
  // every parent before its children.
  struct Node {
    double p;    // calibrated
    double raw;  // the drafter's own
    int depth, candidate, index;
  };
  std::vector<Node> nodes;
  std::vector<std::vector<double>> chance(candidates.size());
  for (int i = 0; i < batch; ++i) {
    const DraftedTree* tree = candidates[i].tree;
    if (tree == nullptr || tree->tokens.empty() || candidates[i].cap <= 0) continue;
    const std::vector<double> raw = PathProbabilities(*tree);
    const std::vector<int32_t> depth = NodeDepths(tree->parents);  // drafted node j: depth[j]
    chance[i].resize(raw.size());
    for (size_t j = 0; j < raw.size(); ++j) {
      const int parent = tree->parents[j];
      double p = calibration.Calibrated(candidates[i].kind, depth[j] + 1, raw[j]);
      if (parent >= 0) p = std::min(p, chance[i][parent]);
      chance[i][j] = p;
      nodes.push_back({p, raw[j], depth[j] + 1, i, static_cast<int>(j)});
    }
  }
  std::sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
    return std::tie(b.p, a.depth, a.candidate, a.index) <
           std::tie(a.p, b.depth, b.candidate, b.index);
  });

  // The order nodes would be added in (parents first, each request within its cap), then the
  // prefix of it with the most expected tokens per predicted millisecond.
  std::vector<std::vector<bool>> kept(candidates.size());
  for (int i = 0; i < batch; ++i) {
    if (candidates[i].tree != nullptr) kept[i].assign(candidates[i].tree->tokens.size(), false);
  }
  std::vector<int> counts(candidates.size(), 0);
  std::vector<const Node*> order;
  for (const Node& n : nodes) {
    const SelectionCandidate& c = candidates[n.candidate];
    const int parent = c.tree->parents[n.index];
    if (counts[n.candidate] >= c.cap || (parent >= 0 && !kept[n.candidate][parent])) continue;
    kept[n.candidate][n.index] = true;
    ++counts[n.candidate];
    order.push_back(&n);
  }
  double tokens = sequences;
  double best_tokens = tokens;
  double best_ms = step_ms(0);
  size_t best = 0;
  for (size_t k = 1; k <= order.size(); ++k) {
    tokens += order[k - 1]->p;
    const double ms = step_ms(k);
    if (tokens * best_ms > best_tokens * ms) {  // tokens / ms > best_tokens / best_ms
      best = k;
      best_tokens = tokens;
      best_ms = ms;
    }
  }
  // The kept prefix in index order per candidate (`order` interleaves the candidates).
  const auto kept_end = order.begin() + static_cast<ptrdiff_t>(best);
  std::sort(order.begin(), kept_end, [](const Node* a, const Node* b) {
    return std::tie(a->candidate, a->index) < std::tie(b->candidate, b->index);
  });
  for (auto it = order.begin(); it != kept_end; ++it) {
    const Node* n = *it;
    out.keep[n->candidate].push_back(n->index);
    out.kept_depths[n->candidate].push_back(n->depth);
    out.kept_probs[n->candidate].push_back(n->raw);
    out.expected[n->candidate] += n->p;
  }
  out.expected_tokens = best_tokens;
  out.predicted_ms = best_ms;
  return out;
}

DraftedTree KeepNodes(const DraftedTree& tree, absl::Span<const int> keep) {
  DraftedTree out;
  std::vector<int> renumbered(tree.tokens.size(), -1);
  const bool with_logprobs = tree.logprobs.size() == tree.tokens.size();
  for (int j : keep) {
    renumbered[j] = static_cast<int>(out.tokens.size());
    out.tokens.push_back(tree.tokens[j]);
    out.parents.push_back(tree.parents[j] < 0 ? -1 : renumbered[tree.parents[j]]);
    if (with_logprobs) out.logprobs.push_back(tree.logprobs[j]);
  }
  return out;
}

}  // namespace treespec
