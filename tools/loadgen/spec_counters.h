// Cross-checking the harness's acceptance figures against the verifiers' own counters
// (verifier_service/serving_metrics.h): scrape every verifier's /metrics before and after a
// run, take the difference, and compare it with what the requests reported. The counters move
// when a request ends, before its last message is sent, so once every response has arrived
// the "after" scrape holds all of them. They match exactly when nothing else used the verifiers
// meanwhile and no request failed after it had started (a failed request's steps are counted
// by the server but not by the harness).
#ifndef TREESPEC_TOOLS_LOADGEN_SPEC_COUNTERS_H_
#define TREESPEC_TOOLS_LOADGEN_SPEC_COUNTERS_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tools/loadgen/http_get.h"
#include "tools/loadgen/prometheus_text.h"

namespace treespec::loadgen {

// Counter values (Prometheus counters are doubles; these hold whole numbers).
struct SpecCounters {
  double drafts = 0;           // treespec_spec_drafts_total
  double draft_tokens = 0;     // treespec_spec_draft_tokens_total
  double accepted_tokens = 0;  // treespec_spec_accepted_tokens_total
  // treespec_spec_accepted_tokens_by_depth_total{depth="d"} at [d - 1].
  std::vector<double> accepted_per_depth;
};

// The counters of one verifier's scrape. NotFound when treespec_spec_drafts_total is missing
// (not a verifier's /metrics); InvalidArgument for a depth label that is not an integer >= 1.
absl::StatusOr<SpecCounters> SpecCountersFromSamples(absl::Span<const MetricSample> samples);

SpecCounters Add(const SpecCounters& a, const SpecCounters& b);
SpecCounters Subtract(const SpecCounters& after, const SpecCounters& before);

// Scrapes every URL and adds their counters; the first failure names its URL.
absl::StatusOr<SpecCounters> ScrapeSpecCounters(absl::Span<const HttpUrl> urls,
                                                absl::Duration timeout = absl::Seconds(10));

// The counters under the summary's key names (spec_decode_num_drafts, spec_decode_draft_tokens,
// spec_decode_accepted_tokens, spec_decode_accepted_tokens_per_position), plus
// spec_decode_acceptance_length (null without drafts).
nlohmann::json ToJson(const SpecCounters& counters);

// How the servers' deltas must relate to the harness's figures.
enum class SpecMatch {
  kExact,           // equal: every request the servers counted reported its figures
  kServersAtLeast,  // each >= the harness's: requests cancelled by the client were counted by
                    // the servers (as far as they ran) but reported nothing to the harness
};

// Each way the servers' `delta` disagrees with the summary of serving_stats.h's Summarize under
// `match` (one line per figure, naming both values); empty when they agree. Trailing zero
// depths are ignored on both sides; under kServersAtLeast depths compare one by one.
std::vector<std::string> CompareWithSummary(const nlohmann::json& summary,
                                            const SpecCounters& delta,
                                            SpecMatch match = SpecMatch::kExact);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_SPEC_COUNTERS_H_
