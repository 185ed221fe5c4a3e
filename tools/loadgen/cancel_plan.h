// Which requests of a load test the client cancels, and when (issue 5, the soak): a seeded share
// of the requests, half of them before their first token and half mid-stream, so that both ways
// a request goes away on a verifier are exercised — while it is queued or in prefill, and while
// it runs with a draft session open. A cancelled request is counted apart from the completed and
// the failed ones and stays out of the latency figures.
#ifndef TREESPEC_TOOLS_LOADGEN_CANCEL_PLAN_H_
#define TREESPEC_TOOLS_LOADGEN_CANCEL_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace treespec::loadgen {

// When one request is cancelled; both fields unset = never.
struct CancelPoint {
  // Mid-stream: once this many tokens have arrived (1 <= after_tokens < the request's output
  // length, so the request is still running); 0 = not by tokens.
  int after_tokens = 0;
  // Before the first token: this long after the send, or at the first token if that comes
  // sooner; < 0 = not by time.
  double after_ms = -1;

  bool planned() const { return after_tokens > 0 || after_ms >= 0; }
};

struct CancelOptions {
  double fraction = 0;        // share of the requests cancelled, in [0, 1]
  double max_delay_ms = 100;  // before-first-token cancels: delay uniform in [0, this]
  uint64_t seed = 0;
};

// One CancelPoint per request, for requests of `output_lens` tokens each. Each request is
// cancelled with probability `fraction`; a cancelled one goes before its first token or
// mid-stream with equal odds (always before the first token when it asks for one token only).
// The same options and lengths give the same plan.
std::vector<CancelPoint> PlanCancels(const CancelOptions& options,
                                     absl::Span<const int> output_lens);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_CANCEL_PLAN_H_
