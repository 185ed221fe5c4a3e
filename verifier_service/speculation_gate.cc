#include "verifier_service/speculation_gate.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace treespec {

int SpeculationGate::Bucket(int running) {
  int bucket = 0;
  for (int n = 1; n < running; n *= 2) ++bucket;
  return bucket;
}

int SpeculationGate::EpochSteps(int running) {
  return std::max(kMinEpochSteps, kEpochStepsPerRequest * running);
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

SpeculationGate::Observed SpeculationGate::ObserveStep(DraftSourceKind kind, int running,
                                                       absl::Span<const Choice> choices, int tokens,
                                                       absl::Time start, absl::Time end,
                                                       double plain_bound) {
  if (start == absl::InfinitePast() || !(end > start) || tokens < 1) return Observed::kNone;
  const Key key = KeyOf(kind, running);
  auto [it, inserted] = states_.try_emplace(key);
  State& s = it->second;
  if (inserted) StartFromNeighbour(key, s);
  // Some request ran on a choice made before the last switch (or in another bucket).
  for (const Choice& c : choices) {
    if (c.tree != s.tree || c.at < s.switched) return Observed::kNone;
  }
  const double ms = absl::ToDoubleMilliseconds(end - start);
  s.epoch.tokens += tokens;
  s.epoch.ms += ms;
  ++s.epoch.steps;
  if (s.epoch.steps < EpochSteps(running)) return Observed::kNone;

  Arm& ran = s.arms[s.tree ? 1 : 0];
  ran.AddEpoch(s.epoch);
  Arm& other = s.arms[s.tree ? 0 : 1];
  // The other arm unmeasured here: estimated from a neighbouring load's ratio, or (plain) from
  // its bound when the trees clearly beat it — a bound, so no doubt the gap is at least that.
  double estimate = 0, doubt = 0;
  if (s.neighbour_ratio > 0) {
    estimate = s.tree ? ran.rate() / s.neighbour_ratio : ran.rate() * s.neighbour_ratio;
    doubt = s.neighbour_doubt;
  } else if (s.tree && plain_bound > 0 && ran.rate() >= kClearMargin * plain_bound) {
    estimate = plain_bound;
  }
  if (other.epochs == 0 && estimate > 0) {
    other.sums = {estimate * ran.sums.ms, ran.sums.ms, ran.sums.steps};
    other.epochs = 1;
    other.estimated = true;
    other.doubt = doubt;
  }
  const double epoch_ms = s.epoch.ms;
  s.last_epoch_rate = s.epoch.tokens / s.epoch.ms;
  s.epoch = {};
  const Arm& plain = s.arms[0];
  const Arm& tree = s.arms[1];
  bool next = s.tree;
  if (tree.epochs == 0) {
    next = true;
  } else if (plain.epochs == 0) {
    next = false;
  } else {
    const bool better = tree.rate() >= plain.rate();
    next = better;  // after a probe, or an arm that has fallen behind: the better one
    if (s.tree == better) {
      s.exploited_ms += epoch_ms;
      const Arm& worse = s.arms[better ? 0 : 1];
      // The gap as far as it is known: the worse arm's figure widened by its doubt.
      const double doubt = std::max(plain.doubt, tree.doubt);
      const double gap = 1 - worse.rate() * (1 + doubt) / s.arms[better ? 1 : 0].rate();
      const double wait_ms = kProbeRatio * std::clamp(gap / kWideGap, 0.1, kMaxProbeWaits) *
                             EpochSteps(running) * worse.step_ms();
      if (s.exploited_ms >= wait_ms) {
        s.exploited_ms = 0;
        next = !better;
      }
    }
  }
  if (next == s.tree) return Observed::kEpoch;
  s.tree = next;
  s.switched = end;
  return Observed::kSwitch;
}

void SpeculationGate::Arm::AddEpoch(const Sums& epoch) {
  const double keep = estimated ? 0 : kEpochDecay;
  sums.tokens = keep * sums.tokens + epoch.tokens;
  sums.ms = keep * sums.ms + epoch.ms;
  sums.steps = static_cast<int>(keep * sums.steps) + epoch.steps;
  estimated = false;
  doubt = 0;
  ++epochs;
}

void SpeculationGate::StartFromNeighbour(Key key, State& s) const {
  // The nearest load of the same kind that has a figure for both arms, the lower one first, up
  // to kNeighbourBuckets away (twice the load or half); a neighbour's own estimate carries its
  // doubt on.
  for (int d = 1; d <= kNeighbourBuckets; ++d) {
    for (const int bucket : {key.second - d, key.second + d}) {
      const auto it = states_.find({key.first, bucket});
      if (it == states_.end() || it->second.arms[0].rate() <= 0 || it->second.arms[1].rate() <= 0) {
        continue;
      }
      const std::array<Arm, 2>& there = it->second.arms;
      s.neighbour_ratio = there[1].rate() / there[0].rate();
      s.neighbour_doubt = std::max(there[0].doubt, there[1].doubt);
      // Trees lose ground to plain steps as the load grows: a verdict carried the way it only
      // gets firmer (plain to a higher load, trees to a lower one) is no less certain there.
      const bool firmer = (bucket > key.second) == (s.neighbour_ratio >= 1);
      if (!firmer) s.neighbour_doubt = (1 + s.neighbour_doubt) * (1 + kNeighbourDoubt) - 1;
      s.tree = s.neighbour_ratio >= 1;
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
  return absl::StrFormat(
      "%s load<=%d: tree %.3f tok/ms (%d epochs%s), plain %.3f tok/ms (%d epochs%s), last "
      "epoch %.3f tok/ms, using %s",
      DraftSourceName(key.first), 1 << key.second, s.arms[1].rate(), s.arms[1].epochs,
      s.arms[1].estimated ? ", estimated" : "", s.arms[0].rate(), s.arms[0].epochs,
      s.arms[0].estimated ? ", estimated" : "", s.last_epoch_rate, s.tree ? "tree" : "plain");
}

}  // namespace treespec
