// Reading the Prometheus text exposition format (version 0.0.4, what the services' /metrics
// serve): one sample per line, `name{label="value",...} value [timestamp]`, with # comments.
#ifndef TREESPEC_TOOLS_LOADGEN_PROMETHEUS_TEXT_H_
#define TREESPEC_TOOLS_LOADGEN_PROMETHEUS_TEXT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace treespec::loadgen {

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;                           // +Inf, -Inf and NaN included
};

// Every sample of `text`; comment and blank lines are skipped, timestamps dropped.
// InvalidArgument naming the line (1-based) and what is wrong otherwise.
absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(absl::string_view text);

// The sum of the samples called `name` whose labels include every pair of `match` (an empty
// `match` sums all of them), and how many there were.
struct SampleSum {
  double sum = 0;
  int count = 0;
};
SampleSum SumSamples(absl::Span<const MetricSample> samples, absl::string_view name,
                     const std::map<std::string, std::string>& match = {});

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_PROMETHEUS_TEXT_H_
