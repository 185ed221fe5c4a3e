// The mixed workload (issue 37): decode streams that run throughout while long prompts arrive.
// `streams` streams (short prompts, long outputs; group "stream") start at once, and each one
// that ends is replaced by a fresh one until every scheduled prompt has been sent; the
// scheduled prompts (the dataset's, sent on the arrival schedule; group "long_prompt") are the
// long ones. The two groups are reported apart: what matters is the streams' inter-token gaps
// while prompts prefill (their median, tail and maximum) and the long prompts' own prefill rate.
#ifndef TREESPEC_TOOLS_LOADGEN_MIXED_LOAD_H_
#define TREESPEC_TOOLS_LOADGEN_MIXED_LOAD_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/request_result.h"

namespace treespec::loadgen {

inline constexpr char kStreamGroup[] = "stream";
inline constexpr char kLongPromptGroup[] = "long_prompt";

struct MixedLoadOptions {
  int streams = 0;  // kept running, >= 1
  int stream_input_len = 0;
  int stream_output_len = 0;
  int vocab_size = 0;  // token ids from [0, vocab_size)
  uint64_t seed = 0;
};

// Stream number `serial` (0, 1, ...): a random prompt of its own.
Prompt StreamPrompt(const MixedLoadOptions& options, int serial);

// What replaces a request that ended: a new stream (number `serial`) when it was a stream and
// prompts are still to be sent; nullopt otherwise.
std::optional<Prompt> NextStream(const MixedLoadOptions& options, const Prompt& ended,
                                 bool sent_all, int serial);

// {"stream": Summarize of the streams, "long_prompt": Summarize of the long prompts plus
// prefill_tokens_per_s (their uncached input tokens over their summed TTFT)} over `requests`
// (by index into `prompts`); the streams' max_itl_ms over median_itl_ms as itl_max_over_median.
nlohmann::json SummarizeMixed(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> requests, double duration_s,
                              absl::Span<const double> percentiles);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_MIXED_LOAD_H_
