// Measures a StepCostModel (step_cost_model.h) on the real model and backend, once at the
// verifier's start: for each grid point it runs verify steps of that shape and keeps the median
// time. A step's context is reserved in the KV cache, not computed: what a step costs depends
// on how many K/V rows it reads, not on their values, so the profile takes no prefill and
// long contexts cost nothing to set up. Steps are greedy without feature capture.
#ifndef TREESPEC_VERIFIER_SERVICE_STEP_COST_PROFILER_H_
#define TREESPEC_VERIFIER_SERVICE_STEP_COST_PROFILER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model/causal_lm.h"
#include "verifier_service/step_cost_model.h"

namespace treespec {

struct StepCostProfileOptions {
  int max_batch = 16;       // the engine's largest batch
  int max_tree_nodes = 64;  // drafted nodes per sequence, at most (the largest tree served)
  // Rows (bonus + drafted, summed over the batch) of the largest step timed; grid points above
  // it are extended along the drafted axis by the slope of the largest timed below it (a
  // step's cost is linear in its rows there), which keeps the profile to seconds on an 8B model.
  int max_step_rows = 1024;
  // Committed tokens per sequence, at most (also bounded by the context length and the KV
  // cache: every sequence of the largest batch holds this much at once).
  int max_context = 8192;
  int reps = 5;  // timed steps per grid point, after one untimed; the median is kept
  // Time the whole profile may take, shared equally by the (batch, context) pairs. A pair times
  // its drafted points coarse to fine — 0 and 1 drafted nodes, the largest tree that fits, then
  // the middles between timed points — and stops once it has used its share (after the first
  // two), skipping a point whose steps would overrun what is left of it by the first two
  // points' slope; points it did not time are interpolated between timed neighbours. On the
  // CPU, where a step costs about its rows, and for the large batches of an 8B model, this is
  // what bounds it.
  double max_seconds = 10;
  std::function<absl::Time()> now = absl::Now;  // the clock (tests pass a fake one)
};

// The grid ProfileStepCost measures for a model of `context_length` positions whose KV cache
// holds `kv_pages` pages of `page_size` slots: batch sizes 1, 2, 4, ... and max_batch; drafted
// nodes 0, 1, 2, 3, 4, 6, 8, 12, ... and max_tree_nodes; contexts per sequence of 64, an eighth
// of the largest and the largest that fits (max_context, the context length less the largest
// tree, and max_batch sequences with their trees in the cache), or fewer where those coincide.
StepCostGrid PlanStepCostGrid(const StepCostProfileOptions& options, int context_length,
                              int kv_pages, int page_size);

// Profiles `model` (it must have no live sequences' pages to spare: the profile takes what the
// largest batch needs and frees it all). INVALID_ARGUMENT for options out of range; the
// model's error if a step fails.
absl::StatusOr<StepCostModel> ProfileStepCost(CausalLm& model,
                                              const StepCostProfileOptions& options);

// The verifier's start: the model stored in `cache_path` if it was measured for `key` (what
// the profile depends on: model, backend, devices, TP, batch and tree limits), else a fresh
// profile, written to `cache_path` (through a temporary file and a rename, so a reader never
// sees half of one) when it is not empty. `*profiled` says which. A cache that cannot be read
// or parsed is profiled over (and replaced); one that cannot be written is an error naming the
// path.
absl::StatusOr<StepCostModel> LoadOrProfileStepCost(CausalLm& model,
                                                    const StepCostProfileOptions& options,
                                                    const std::string& cache_path,
                                                    const std::string& key, bool* profiled);

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_STEP_COST_PROFILER_H_
