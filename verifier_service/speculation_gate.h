// Whether an auto request's next step asks its drafter for a tree at all (issue 34).
//
// The tree selection (tree_selection.h) weighs drafted nodes against what the verify step
// costs; it cannot see what *waiting* for a tree costs. A request that speculates waits for its
// drafter's round trip between its steps (all of it at batch 1, little of it at high load,
// where other requests' steps run meanwhile), and its drafter may share the verifier's GPU or
// cores. Where that wait is longer than what the accepted tokens save, speculation loses to
// plain decoding however well the nodes are chosen — the tiny pair on a GPU verifies a step in
// ~0.2 ms, less than one drafter round trip.
//
// So the gate measures what each choice delivers, per drafter kind and load bucket (running
// requests, in powers of two): the throughput itself, tokens that the kind's auto requests
// gained per wall millisecond of the engine's steps, with trees asked for ("tree" arm) and
// without ("plain" arm). All requests of a bucket use the same arm at a time — one request
// waiting for its tree delays the others' steps, so an arm is only measured cleanly when every
// request runs it — and a step in which some request still runs on a choice made before the
// last switch is left out. Prefills are part of both arms alike (in a closed loop they come
// with every finished request), so they are measured, not modelled.
//
// The gate runs the tree arm for an epoch (kMinEpochSteps steps, kEpochStepsPerRequest per
// running request if more), then the plain arm as long — unless the trees beat by kClearMargin
// what plain steps could deliver at most (the step-cost model's forward time for them, without
// host time or prefills), which then stands in for the plain arm until a probe measures it —
// then the better one. It probes the other arm for one epoch once the better one has run long
// enough: kProbeRatio times that epoch's expected time per kWideGap of the arms' gap (at least
// a tenth of that, at most kMaxProbeWaits times), so that a probe, which costs about the gap
// for one epoch, costs ~kWideGap / kProbeRatio (0.5 %) of the throughput however wide the gap,
// and a close call, or a change (load, acceptance, a drafter that sped up), is noticed soon.
// Each arm's figure is its epochs' tokens and time, halved every newer epoch. A load seen for
// the first time starts from its nearest measured one's verdict (the ratio of the two arms
// there) and estimates the arm it does not run by that ratio. Trees lose ground to plain steps
// as the load grows (in every sweep measured: the 8B shape at τ 2, 4 and 6, the tiny pair), so
// a verdict carried the way it gets firmer (plain upwards, trees downwards) is taken as it is;
// carried the other way the ratio may be off by a factor of 1 + kNeighbourDoubt per load, and
// the gap counts only beyond that, so such a verdict carried far is soon probed. Engine thread
// only.
#ifndef TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_
#define TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_

#include <array>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "verifier_service/tree_selection.h"

namespace treespec {

class SpeculationGate {
 public:
  static constexpr int kMinEpochSteps = 16;
  static constexpr int kEpochStepsPerRequest = 2;
  static constexpr double kProbeRatio = 50;
  static constexpr double kWideGap = 0.25;
  static constexpr double kMaxProbeWaits = 4;
  static constexpr double kEpochDecay = 0.5;
  // By what factor (less 1) the arms' ratio may move from one load bucket to the next: the 8B's
  // τ≈2 trees were 1.7× plain at 1 request and 0.91× at 4. A factor, not a margin of the gap:
  // the tiny pair's trees, 0.48× plain at 1 request, are never near plain at 32, and a margin
  // added per load made every load past the fourth probe them after a few epochs.
  static constexpr double kNeighbourDoubt = 0.3;
  static constexpr int kNeighbourBuckets = 1;
  // The tree arm's first epoch beats the plain arm's bound by this much: plain is not explored.
  static constexpr double kClearMargin = 1.25;

  // The load bucket of `running` requests: 0 for 1, 1 for 2, 2 for 3–4, 3 for 5–8, ...
  static int Bucket(int running);
  // Steps of an epoch with `running` requests running.
  static int EpochSteps(int running);

  // Whether the next step of a request of `kind`, with `running` requests running, asks for a
  // tree: the bucket's current arm.
  bool WantsTree(DraftSourceKind kind, int running) const;

  // A request's choice: whether it asked for a tree, and when it chose.
  struct Choice {
    bool tree = true;
    absl::Time at;
  };
  // A verify step that ran from `start` (the previous step's end; InfinitePast when the engine
  // was idle before it, which is not scored) to `end` with `running` requests running, in
  // which the auto requests of `kind` gained `tokens`; `choices` are those of them that chose
  // an arm for it (a prefill has none). `plain_bound`: tokens per ms that plain steps could
  // deliver at most at this load (the step-cost model's forward time alone; 0: unknown). May
  // end an epoch and switch the bucket's arm, as of `end`: returns which.
  enum class Observed { kNone, kEpoch, kSwitch };
  Observed ObserveStep(DraftSourceKind kind, int running, absl::Span<const Choice> choices,
                       int tokens, absl::Time start, absl::Time end, double plain_bound = 0);

  // Tokens per millisecond of an arm so far; 0 before its first epoch.
  double Rate(DraftSourceKind kind, int running, bool tree) const;
  // (kind, running)'s bucket: "kind load<=N: tree X tok/ms (n epochs), plain Y tok/ms (n
  // epochs), last epoch Z tok/ms, using A"; empty before its first step.
  std::string Describe(DraftSourceKind kind, int running) const;

 private:
  struct Sums {
    double tokens = 0, ms = 0;
    int steps = 0;
  };
  struct Arm {
    Sums sums;  // of its epochs, decayed
    int epochs = 0;
    // Not measured at this load: the other arm's first epoch here, scaled by the two arms'
    // ratio at the neighbouring load this one started from (or the plain bound), which may be
    // too low by a factor of up to 1 + `doubt`. The first real epoch replaces it.
    bool estimated = false;
    double doubt = 0;
    double rate() const { return sums.ms > 0 ? sums.tokens / sums.ms : 0; }
    double step_ms() const { return sums.steps > 0 ? sums.ms / sums.steps : 0; }
    void AddEpoch(const Sums& epoch);
  };
  struct State {
    std::array<Arm, 2> arms;  // [0] plain, [1] tree
    bool tree = true;         // the arm in use
    Sums epoch;               // of the arm in use since its epoch began
    double last_epoch_rate = 0;
    double exploited_ms = 0;  // time on the better arm since the last probe
    absl::Time switched = absl::InfinitePast();
    // Tree rate / plain rate at the load this one started from, and how uncertain it is here;
    // 0 when it started afresh.
    double neighbour_ratio = 0, neighbour_doubt = 0;
  };
  using Key = std::pair<int, int>;  // (kind index, bucket)
  static Key KeyOf(DraftSourceKind kind, int running);
  // A load seen for the first time starts with the arm that was better at the neighbouring load
  // of its kind (half or twice), if that has a figure for both (measured or itself estimated),
  // and their ratio there, its doubt the neighbour's, compounded by 1 + kNeighbourDoubt unless
  // the verdict only gets firmer in that direction: rates scale with the load, ratios change
  // more slowly with it. Its first epoch then estimates the other arm by that ratio, and probes
  // measure it, instead of exploring both from nothing.
  void StartFromNeighbour(Key key, State& s) const;

  absl::flat_hash_map<Key, State> states_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_
