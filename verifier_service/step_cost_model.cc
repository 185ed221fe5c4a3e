#include "verifier_service/step_cost_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace treespec {
namespace {

// No prediction goes below this (an extrapolated slope from noisy points could).
constexpr double kFloorMs = 1e-3;

absl::Status CheckAxis(const std::vector<int>& axis, int min, const char* name) {
  if (axis.empty()) return absl::InvalidArgumentError(absl::StrCat("step cost grid: no ", name));
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] < min || (i > 0 && axis[i] <= axis[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("step cost grid: ", name,
                                                     " must ascend strictly from at least ", min,
                                                     "; point ", i, " is ", axis[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepCostModel> StepCostModel::Create(StepCostGrid grid, std::vector<double> ms,
                                                    double refresh_weight) {
  for (absl::Status s : {CheckAxis(grid.batch, 1, "batch"), CheckAxis(grid.drafted, 0, "drafted"),
                         CheckAxis(grid.context, 0, "context")}) {
    if (!s.ok()) return s;
  }
  if (ms.size() != grid.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step cost grid: ", ms.size(), " values for ", grid.size(), " points"));
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!std::isfinite(ms[i]) || ms[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step cost grid: value ", i, " is ", ms[i], ", not a positive time"));
    }
  }
  if (!(refresh_weight > 0 && refresh_weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step cost refresh weight ", refresh_weight, " is not in (0, 1]"));
  }
  return StepCostModel(std::move(grid), std::move(ms), refresh_weight);
}

StepCostModel::AxisWeights StepCostModel::Locate(const std::vector<int>& axis, double x,
                                                 bool clamp) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0, 0};
  // The segment holding x, or the last one beyond the end.
  const size_t hi = std::min<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin(),
                                     axis.size() - 1);
  const size_t lo = hi - 1;
  double t = (x - axis[lo]) / (axis[hi] - axis[lo]);
  if (clamp) t = std::min(t, 1.0);
  return {lo, hi, t};
}

StepCostModel::Corners StepCostModel::Around(const StepShape& shape, bool clamp) const {
  const AxisWeights b = Locate(grid_.batch, shape.batch, clamp);
  const AxisWeights d = Locate(grid_.drafted, shape.drafted, clamp);
  const AxisWeights c = Locate(grid_.context, shape.context, clamp);
  Corners out;
  int i = 0;
  for (int bi = 0; bi < 2; ++bi) {
    for (int di = 0; di < 2; ++di) {
      for (int ci = 0; ci < 2; ++ci, ++i) {
        out.index[i] = grid_.Index(bi ? b.hi : b.lo, di ? d.hi : d.lo, ci ? c.hi : c.lo);
        out.weight[i] = (bi ? b.t : 1 - b.t) * (di ? d.t : 1 - d.t) * (ci ? c.t : 1 - c.t);
      }
    }
  }
  return out;
}

double StepCostModel::PromptsMs(const StepShape& step, const StepShape& verify) const {
  return std::max(0.0, PredictMs(step) - (verify.batch > 0 ? PredictMs(verify) : 0.0));
}

double StepCostModel::PredictMs(const StepShape& shape) const {
  const Corners around = Around(shape, /*clamp=*/false);
  double ms = 0;
  for (int i = 0; i < 8; ++i) ms += around.weight[i] * ms_[around.index[i]];
  return std::max(ms, kFloorMs);
}

void StepCostModel::Observe(const StepShape& shape, double measured_ms) {
  if (!std::isfinite(measured_ms) || measured_ms <= 0) return;
  // The clamped shape's prediction moves by refresh_weight of the error: with weights w_i
  // (summing to 1), moving cell i by refresh_weight · w_i · error / Σ w_j² does exactly that.
  const Corners around = Around(shape, /*clamp=*/true);
  double predicted = 0, norm = 0;
  for (int i = 0; i < 8; ++i) {
    predicted += around.weight[i] * ms_[around.index[i]];
    norm += around.weight[i] * around.weight[i];
  }
  const double step = refresh_weight_ * (measured_ms - predicted) / norm;
  for (int i = 0; i < 8; ++i) {
    double& cell = ms_[around.index[i]];
    cell = std::max(cell + step * around.weight[i], kFloorMs);
  }
}

std::string StepCostModel::ToJson(const std::string& key) const {
  nlohmann::json j;
  j["key"] = key;
  j["batch"] = grid_.batch;
  j["drafted"] = grid_.drafted;
  j["context"] = grid_.context;
  j["ms"] = ms_;
  return j.dump(1);
}

absl::StatusOr<StepCostModel> StepCostModel::FromJson(std::string_view json,
                                                      const std::string& key) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("step cost model: not a JSON object");
  }
  StepCostGrid grid;
  std::vector<double> ms;
  std::string stored_key;
  try {
    stored_key = j.at("key").get<std::string>();
    grid.batch = j.at("batch").get<std::vector<int>>();
    grid.drafted = j.at("drafted").get<std::vector<int>>();
    grid.context = j.at("context").get<std::vector<int>>();
    ms = j.at("ms").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("step cost model: ", e.what()));
  }
  if (stored_key != key) {
    return absl::FailedPreconditionError(
        absl::StrCat("step cost model was measured for '", stored_key, "', not for '", key, "'"));
  }
  return Create(std::move(grid), std::move(ms));
}

std::string StepCostModel::Describe() const {
  std::string out = "ms per verify step; columns: drafted nodes per sequence";
  for (int d : grid_.drafted) absl::StrAppend(&out, " ", d);
  for (size_t b = 0; b < grid_.batch.size(); ++b) {
    for (size_t c = 0; c < grid_.context.size(); ++c) {
      absl::StrAppend(&out, "\n  batch ", grid_.batch[b], ", context ", grid_.context[c], ":");
      for (size_t d = 0; d < grid_.drafted.size(); ++d) {
        absl::StrAppend(&out, absl::StrFormat(" %.3g", ms_[grid_.Index(b, d, c)]));
      }
    }
  }
  return out;
}

}  // namespace treespec
