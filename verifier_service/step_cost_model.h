// What a verify step costs, as a function of its shape (issue 34): measured on the real model at
// the verifier's start (step_cost_profiler.h) over a grid of batch size × drafted nodes per
// sequence × committed tokens per sequence, interpolated between the grid points and refreshed
// online from the measured time of every step. The tree selection asks it for the marginal cost
// of verifying more nodes.
//
// The axes are per-sequence averages so that every grid point is a step the engine could run
// (a sequence's tree is at most the largest tree, its context at most the context length), and
// because the step's two costs follow them: the GEMMs stream the weights once and grow with the
// rows (batch × (1 + drafted)), the attention reads each sequence's K/V once per tile of its
// rows and grows with batch × context. Between grid points the model is trilinear; beyond the
// last point of an axis it extends the last segment's slope (both costs are linear there), and
// before the first it clamps.
#ifndef TREESPEC_VERIFIER_SERVICE_STEP_COST_MODEL_H_
#define TREESPEC_VERIFIER_SERVICE_STEP_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace treespec {

// One verify step as the cost model sees it.
struct StepShape {
  int batch = 0;       // sequences in the step (>= 1)
  double drafted = 0;  // drafted nodes per sequence, on average (each also verifies its bonus)
  double context = 0;  // committed tokens per sequence, on average
};

// The grid the model was measured on; every axis strictly ascending.
struct StepCostGrid {
  std::vector<int> batch;    // >= 1
  std::vector<int> drafted;  // >= 0
  std::vector<int> context;  // >= 0

  size_t size() const { return batch.size() * drafted.size() * context.size(); }
  // Position of point (b, d, c) in the flat, batch-major value array.
  size_t Index(size_t b, size_t d, size_t c) const {
    return (b * drafted.size() + d) * context.size() + c;
  }
};

class StepCostModel {
 public:
  // The model of `ms` (milliseconds, grid.size() values, batch-major: grid.Index) measured on
  // `grid`. `refresh_weight` in (0, 1]: how far one observed step moves the prediction at its
  // shape toward the measured time (an exponential average per grid cell). INVALID_ARGUMENT for
  // an empty or unsorted axis, a value count that does not match, or a value that is not a
  // positive finite number.
  static absl::StatusOr<StepCostModel> Create(StepCostGrid grid, std::vector<double> ms,
                                              double refresh_weight = kDefaultRefreshWeight);
  static constexpr double kDefaultRefreshWeight = 0.1;

  // Predicted time of a step of `shape`, in milliseconds (> 0).
  double PredictMs(const StepShape& shape) const;
  // What a step of shape `step` that prefills prompts is priced at for them: its prediction
  // less that of `verify`, its members that prefill nothing (none: batch 0); never below 0
  // (averaging a short prompt into the shape can lower a cross term more than the prompt adds).
  double PromptsMs(const StepShape& step, const StepShape& verify) const;
  // A step of `shape` took `measured_ms`: the grid cells around the shape move toward it, each
  // by its share of the interpolation (the shape clamped into the grid), so a repeated shape's
  // prediction approaches its measured time geometrically. Non-finite or non-positive times
  // are ignored.
  void Observe(const StepShape& shape, double measured_ms);

  const StepCostGrid& grid() const { return grid_; }
  const std::vector<double>& ms() const { return ms_; }

  // The model as JSON, tagged with `key` (what it was measured for: model, device, TP, ...).
  std::string ToJson(const std::string& key) const;
  // The model in `json` (ToJson's form). INVALID_ARGUMENT if it does not parse or fails
  // Create's checks; FAILED_PRECONDITION naming both keys if it was measured for another key.
  static absl::StatusOr<StepCostModel> FromJson(std::string_view json, const std::string& key);

  // The grid's values as lines of text (one per batch size and context), for the start log.
  std::string Describe() const;

 private:
  // One axis's two neighbouring points and the weight of the upper one (may leave [0, 1]
  // outside the axis unless `clamp`).
  struct AxisWeights {
    size_t lo = 0, hi = 0;
    double t = 0;
  };
  static AxisWeights Locate(const std::vector<int>& axis, double x, bool clamp);
  // The eight cells around `shape` and their weights.
  struct Corners {
    std::array<size_t, 8> index;
    std::array<double, 8> weight;
  };
  Corners Around(const StepShape& shape, bool clamp) const;

  StepCostModel(StepCostGrid grid, std::vector<double> ms, double refresh_weight)
      : grid_(std::move(grid)), ms_(std::move(ms)), refresh_weight_(refresh_weight) {}

  StepCostGrid grid_;
  std::vector<double> ms_;  // [grid.size()], batch-major
  double refresh_weight_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_STEP_COST_MODEL_H_
