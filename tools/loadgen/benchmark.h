// One treespec-loadgen run from start to end: ask the verifiers for their model, build the
// dataset and the send times, warm up, scrape the verifiers' counters, drive the load, scrape
// again, summarise, write the files and print the report.
#ifndef TREESPEC_TOOLS_LOADGEN_BENCHMARK_H_
#define TREESPEC_TOOLS_LOADGEN_BENCHMARK_H_

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tools/loadgen/run_config.h"

namespace treespec::loadgen {

struct BenchmarkOutcome {
  // Summarize's keys plus date, backend, model_id, num_prompts, request_rate, burstiness,
  // max_concurrency (as vLLM's result file has them), not_sent, retried_requests, per_target
  // ({address: {completed, failed, cancelled}}), errors ({message: count}, failures only),
  // config, and with --metrics_urls metrics_check ({urls, comparison: exact, or
  // servers_at_least when requests were cancelled, servers: the counters' deltas, mismatches,
  // ok} or {urls, error}).
  nlohmann::json summary;
  bool metrics_check_passed = true;  // no check asked for, or the deltas agree with the harness
};

// Errors (a target that does not answer, a dataset that cannot be read, an output file that
// cannot be written, a failed warm-up request or a failed "before" scrape) end the run before
// the load with a message naming the cause. A failed "after" scrape is reported in the summary.
absl::StatusOr<BenchmarkOutcome> RunBenchmark(const RunConfig& config);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_BENCHMARK_H_
