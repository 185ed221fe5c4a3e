#include "verifier_service/speculation_gate.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace treespec {

int SpeculationGate::Bucket(int running) {
  int bucket = 0;
  for (int n = 1; n < running; n *= 2) ++bucket;
  return bucket;
}

SpeculationGate::Key SpeculationGate::KeyOf(DraftSourceKind kind, int running) {
  return {DraftSourceIndex(kind), Bucket(running)};
}

bool SpeculationGate::WantsTree(DraftSourceKind kind, int running) const {
  const Key key = KeyOf(kind, running);
  const auto it = states_.find(key);
  if (it != states_.end()) return it->second.tree;
  State fresh;
  StartFromNeighbour(key, fresh);
  return fresh.tree;
}

bool SpeculationGate::Observe(DraftSourceKind kind, int running, bool asked_tree, int tokens,
                              absl::Time start, absl::Time end, double excluded_ms) {
  const double cycle_ms = absl::ToDoubleMilliseconds(end - start) - excluded_ms;
  if (!(cycle_ms > 0) || tokens < 1) return false;
  const Key key = KeyOf(kind, running);
  auto [it, inserted] = states_.try_emplace(key);
  State& s = it->second;
  if (inserted) StartFromNeighbour(key, s);
  // Decided before the last switch, or run partly beside requests that were.
  if (asked_tree != s.tree || start < s.switched) return false;
  Arm& arm = s.arms[asked_tree ? 1 : 0];
  const double decay = 1 - (1 - kDecay) / std::max(1, running);
  arm.tokens = decay * arm.tokens + tokens;
  arm.ms = decay * arm.ms + cycle_ms;
  arm.weight = decay * arm.weight + 1;
  ++arm.samples;
  ++s.epoch_samples;
  const Arm& plain = s.arms[0];
  const Arm& tree = s.arms[1];
  const int epoch = std::max(kMinSamples, kEpochSteps * running);
  auto use = [&s, end](bool tree_arm) {
    if (s.tree == tree_arm) return false;
    s.epoch_samples = 0;
    s.tree = tree_arm;
    s.switched = end;
    return true;
  };
  if (tree.samples < epoch) return use(true);
  if (plain.samples < epoch) return use(false);
  const bool better = tree.rate() >= plain.rate();
  if (s.tree != better) {
    // A probe (or an arm that has just fallen behind): one epoch, then the better one.
    return s.epoch_samples >= epoch && use(better);
  }
  s.exploited_ms += cycle_ms;
  const double probe_ms = epoch * s.arms[better ? 0 : 1].mean_ms();
  if (s.exploited_ms < kProbeRatio * probe_ms) return false;
  s.exploited_ms = 0;
  return use(!better);
}

void SpeculationGate::StartFromNeighbour(Key key, State& s) const {
  // The nearest load of the same kind that has measured both arms, the lower one first.
  for (int d = 1; d < 64; ++d) {
    for (const int bucket : {key.second - d, key.second + d}) {
      const auto it = states_.find({key.first, bucket});
      if (it == states_.end() || it->second.arms[0].samples == 0 ||
          it->second.arms[1].samples == 0) {
        continue;
      }
      s.arms = it->second.arms;
      s.tree = s.arms[1].rate() >= s.arms[0].rate();
      return;
    }
  }
}

double SpeculationGate::Rate(DraftSourceKind kind, int running, bool tree) const {
  auto it = states_.find(KeyOf(kind, running));
  return it == states_.end() ? 0 : it->second.arms[tree ? 1 : 0].rate();
}

std::string SpeculationGate::Describe(DraftSourceKind kind, int running) const {
  const Key key = KeyOf(kind, running);
  const auto it = states_.find(key);
  if (it == states_.end()) return "";
  const State& s = it->second;
  return absl::StrFormat("%s load<=%d: tree %.3f tok/ms (%d), plain %.3f tok/ms (%d), using %s",
                         DraftSourceName(key.first), 1 << key.second, s.arms[1].rate(),
                         s.arms[1].samples, s.arms[0].rate(), s.arms[0].samples,
                         s.tree ? "tree" : "plain");
}

}  // namespace treespec
