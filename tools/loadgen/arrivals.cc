#include "tools/loadgen/arrivals.h"

#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace treespec::loadgen {

absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name) {
  if (name == "poisson") return ArrivalProcess::kPoisson;
  if (name == "gamma") return ArrivalProcess::kGamma;
  if (name == "constant") return ArrivalProcess::kConstant;
  return absl::InvalidArgumentError(
      absl::StrCat("arrival process \"", name, "\": expected poisson, gamma or constant"));
}

absl::StatusOr<std::vector<double>> ArrivalTimes(const ArrivalOptions& options, int count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("request count ", count, " < 0"));
  if (!(options.rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request rate ", options.rate, ": must be > 0 (or inf: all at once)"));
  }
  if (!(options.burstiness > 0) || !std::isfinite(options.burstiness)) {
    return absl::InvalidArgumentError(
        absl::StrCat("burstiness ", options.burstiness, ": must be finite and > 0"));
  }
  std::vector<double> times(count, 0.0);
  if (std::isinf(options.rate)) return times;
  std::mt19937_64 rng(options.seed);
  const double mean_gap = 1.0 / options.rate;
  std::exponential_distribution<double> exponential(options.rate);
  std::gamma_distribution<double> gamma(options.burstiness, mean_gap / options.burstiness);
  double t = 0;
  for (double& time : times) {
    switch (options.process) {
      case ArrivalProcess::kPoisson:
        t += exponential(rng);
        break;
      case ArrivalProcess::kGamma:
        t += gamma(rng);
        break;
      case ArrivalProcess::kConstant:
        t += mean_gap;
        break;
    }
    time = t;
  }
  return times;
}

}  // namespace treespec::loadgen
