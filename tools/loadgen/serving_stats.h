// The numbers a load test reports (issue 4), with the definitions and the JSON key names of
// vLLM's serving benchmark (`vllm bench serve`), so results sit side by side:
//   TTFT  time from sending a request to its first token;
//   TPOT  per request, (E2EL - TTFT) / (output tokens - 1): the mean time per token after the
//         first (requests of one token have none);
//   ITL   every gap between two stream messages that brought tokens. With speculation a message
//         brings several tokens, so the mean ITL exceeds the mean TPOT by about the tokens per
//         message;
//   E2EL  time from sending a request to its last token;
//   goodput  completed requests per second that met every given SLO (TTFT, TPOT, E2EL).
// Speculation adds: drafts (verify steps that checked a draft), draft tokens, accepted tokens
// and accepted tokens per draft depth, summed over requests; mean acceptance length = 1 +
// accepted / drafts.
#ifndef TREESPEC_TOOLS_LOADGEN_SERVING_STATS_H_
#define TREESPEC_TOOLS_LOADGEN_SERVING_STATS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace treespec::loadgen {

// One request as the harness saw it. Times in ms from the request's send.
struct RequestRecord {
  bool ok = false;  // completed without error (failed requests count only as failures)
  // The client cancelled it on purpose (--cancel_fraction) before it completed: counted apart,
  // neither completed nor failed, and left out of every other figure.
  bool cancelled = false;
  int input_tokens = 0;
  int cached_tokens = 0;  // of the input, reused from the verifier's prefix cache
  int output_tokens = 0;
  double ttft_ms = 0;
  double e2el_ms = 0;
  std::vector<double> itl_ms;  // gaps between token-carrying messages after the first
  // Speculation, as the verifier reported it for this request.
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_depth;  // [depth 1, 2, ...]
  std::vector<int32_t> output_ids;          // the tokens received, in order
};

// Service-level objectives for goodput; unset ones are not checked.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
};

// The p-th percentile (0 <= p <= 100) by linear interpolation between closest ranks (numpy's
// default, which vLLM uses); 0 for no values.
double Percentile(absl::Span<const double> values, double p);

// TPOT of one record, or nullopt when it has fewer than 2 output tokens.
std::optional<double> Tpot(const RequestRecord& r);

// Whether a completed record meets every SLO that is set.
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// The summary of a run of `duration_s` seconds: completed, failed, cancelled, total_input_tokens,
// total_cached_tokens, prefix_cache_hit_rate (cached / input tokens, null without input),
// total_output_tokens, request_throughput, request_goodput (when any SLO is set),
// output_throughput, total_token_throughput, {mean,median,std,max,p<P>}_{ttft,tpot,itl,e2el}_ms for
// each P of `percentiles` (p99 is written "p99", p99.9 "p99.9"), and the speculation figures
// spec_decode_num_drafts, spec_decode_draft_tokens, spec_decode_accepted_tokens,
// spec_decode_acceptance_rate (accepted / draft tokens, %), spec_decode_acceptance_length
// (1 + accepted / drafts) and spec_decode_per_position_acceptance_rates (accepted at depth d /
// drafts; the rate and the length are null without drafts) with its counts
// spec_decode_accepted_tokens_per_position. Standard deviations are population ones (numpy's
// default).
nlohmann::json Summarize(absl::Span<const RequestRecord> records, double duration_s,
                         absl::Span<const double> percentiles, const Slo& slo = {});

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_SERVING_STATS_H_
