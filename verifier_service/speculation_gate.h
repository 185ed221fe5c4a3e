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
// So the gate measures what each choice actually delivers: per drafter kind and load bucket
// (running requests, in powers of two; a new bucket starts from its nearest measured one), the
// tokens a request gained per millisecond between its consecutive verify steps, with a tree asked
// for ("tree" arm) and without ("plain" arm), as exponentially decayed sums that remember about ten
// steps of every running request. All requests of a bucket use the same arm at a time: one request
// waiting for its tree delays the steps of the others, so an arm is only measured cleanly when
// every request runs it, and a step whose interval began before the last switch is left out. (The
// engine takes out of each interval what prompts prefilled meanwhile added: it depends on neither
// arm.) The gate first runs the tree arm for an epoch, then the plain arm as long, then the better
// one; it probes the other for one epoch once the better one has run kProbeRatio times that epoch's
// expected time, so that a probe costs at most ~1 / kProbeRatio of the throughput and a change
// (load, acceptance, a drafter that sped up) is noticed. An epoch is kEpochSteps steps of every
// running request, at least kMinSamples. Engine thread only.
#ifndef TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_
#define TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_

#include <array>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "verifier_service/tree_selection.h"

namespace treespec {

class SpeculationGate {
 public:
  static constexpr int kMinSamples = 8;
  static constexpr int kEpochSteps = 1;
  static constexpr double kProbeRatio = 50;
  // With one request running, each observation keeps this share of its arm's old sums (about
  // ten steps of memory); with n running, 1 - (1 - kDecay) / n.
  static constexpr double kDecay = 0.9;

  // The load bucket of `running` requests: 0 for 1, 1 for 2, 2 for 3–4, 3 for 5–8, ...
  static int Bucket(int running);

  // Whether the next step of a request of `kind`, with `running` requests running, asks for a
  // tree: the bucket's current arm.
  bool WantsTree(DraftSourceKind kind, int running) const;
  // A verify step of such a request, decided with `running` running: whether it had asked for
  // a tree, the tokens it emitted, and the interval from its previous step's forward end to
  // this one's, less `excluded_ms` of it (time that depended on neither arm: prompts prefilled
  // meanwhile). May switch the bucket's arm: returns whether it did.
  bool Observe(DraftSourceKind kind, int running, bool asked_tree, int tokens, absl::Time start,
               absl::Time end, double excluded_ms = 0);

  // Tokens per millisecond of an arm so far; 0 before its first sample.
  double Rate(DraftSourceKind kind, int running, bool tree) const;
  // (kind, running)'s bucket: "kind load<=N: tree X tok/ms (n), plain Y tok/ms (n), using A";
  // empty before its first step.
  std::string Describe(DraftSourceKind kind, int running) const;

 private:
  struct Arm {
    double tokens = 0, ms = 0, weight = 0;  // decayed sums (weight: of the samples, each 1)
    int samples = 0;
    double rate() const { return ms > 0 ? tokens / ms : 0; }
    double mean_ms() const { return weight > 0 ? ms / weight : 0; }  // of one step
  };
  struct State {
    std::array<Arm, 2> arms;  // [0] plain, [1] tree
    bool tree = true;         // the arm in use
    int epoch_samples = 0;    // samples of it since it was switched to
    double exploited_ms = 0;  // time on the better arm since the last probe
    absl::Time switched = absl::InfinitePast();
  };
  using Key = std::pair<int, int>;  // (kind index, bucket)
  static Key KeyOf(DraftSourceKind kind, int running);
  // A load seen for the first time starts with the sums (and so the arm) of the nearest load
  // of its kind that has measured both arms, if any: its own steps then refine the arm in use
  // and the probes the other, instead of exploring both from nothing.
  void StartFromNeighbour(Key key, State& s) const;

  absl::flat_hash_map<Key, State> states_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_SPECULATION_GATE_H_
