#include "tools/loadgen/cancel_plan.h"

#include <algorithm>
#include <random>

namespace treespec::loadgen {
namespace {

// Keeps the plan's random stream apart from the dataset's and the arrivals', which use the
// same --seed: the golden-ratio constant, the usual odd 64-bit spreader.
constexpr uint64_t kStream = 0x9E3779B97F4A7C15ull;

}  // namespace

std::vector<CancelPoint> PlanCancels(const CancelOptions& options,
                                     absl::Span<const int> output_lens) {
  std::vector<CancelPoint> plan(output_lens.size());
  if (options.fraction <= 0) return plan;
  std::mt19937_64 rng(options.seed ^ kStream);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < plan.size(); ++i) {
    // Three draws per request whatever the outcome, so one request's plan does not shift the
    // next ones' when the fraction or a length changes.
    const double chosen = unit(rng), kind = unit(rng), where = unit(rng);
    if (chosen >= options.fraction) continue;
    const int len = output_lens[i];
    if (len >= 2 && kind >= 0.5) {
      // Uniform over 1 .. len - 1.
      plan[i].after_tokens = 1 + std::min(static_cast<int>(where * (len - 1)), len - 2);
    } else {
      plan[i].after_ms = where * options.max_delay_ms;
    }
  }
  return plan;
}

}  // namespace treespec::loadgen
