// When a load test sends its requests (issue 4): the arrival processes of vLLM's serving
// benchmark, seeded so a run can be repeated.
//   - Poisson: exponential gaps of mean 1 / rate;
//   - gamma: gaps Gamma(shape = burstiness, scale = 1 / (rate · burstiness)), so the mean gap is
//     still 1 / rate and the coefficient of variation 1 / sqrt(burstiness): burstiness < 1 is
//     burstier than Poisson, > 1 smoother, 1 is Poisson;
//   - constant: every 1 / rate;
//   - rate = infinity: every request at time 0 (a closed loop then bounds the concurrency).
#ifndef TREESPEC_TOOLS_LOADGEN_ARRIVALS_H_
#define TREESPEC_TOOLS_LOADGEN_ARRIVALS_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace treespec::loadgen {

enum class ArrivalProcess { kPoisson, kGamma, kConstant };

// "poisson", "gamma" or "constant"; InvalidArgument naming the choices otherwise.
absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name);

struct ArrivalOptions {
  ArrivalProcess process = ArrivalProcess::kPoisson;
  double rate = std::numeric_limits<double>::infinity();  // requests per second
  double burstiness = 1.0;                                // the gamma shape (kGamma only)
  uint64_t seed = 0;
};

// Send times in seconds from the start, non-decreasing, for `count` requests; the first
// request waits one gap too (as vLLM's generator does). InvalidArgument for count < 0, a rate
// that is not > 0 (infinity is allowed) or a burstiness that is not finite and > 0.
absl::StatusOr<std::vector<double>> ArrivalTimes(const ArrivalOptions& options, int count);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_ARRIVALS_H_
