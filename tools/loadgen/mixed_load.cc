#include "tools/loadgen/mixed_load.h"

#include <random>

#include "common/util/mix64.h"
#include "tools/loadgen/serving_stats.h"

namespace treespec::loadgen {

Prompt StreamPrompt(const MixedLoadOptions& o, int serial) {
  std::mt19937_64 rng(Mix64(o.seed ^ (kGolden64 * (static_cast<uint64_t>(serial) + 1))));
  std::uniform_int_distribution<int32_t> id(0, o.vocab_size - 1);
  Prompt p;
  p.token_ids.resize(o.stream_input_len);
  for (int32_t& t : p.token_ids) t = id(rng);
  p.output_len = o.stream_output_len;
  p.group = kStreamGroup;
  return p;
}

std::optional<Prompt> NextStream(const MixedLoadOptions& o, const Prompt& ended, bool sent_all,
                                 int serial) {
  if (sent_all || ended.group != kStreamGroup) return std::nullopt;
  return StreamPrompt(o, serial);
}

nlohmann::json SummarizeMixed(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> requests, double duration_s,
                              absl::Span<const double> percentiles) {
  std::vector<RequestRecord> streams, long_prompts;
  double uncached = 0, ttft_ms = 0;
  for (const RequestResult& r : requests) {
    const Prompt& p = prompts[r.index];
    if (p.group == kStreamGroup) {
      streams.push_back(r.record);
    } else {
      long_prompts.push_back(r.record);
      if (r.record.ok) {
        uncached += r.record.input_tokens - r.record.cached_tokens;
        ttft_ms += r.record.ttft_ms;
      }
    }
  }
  nlohmann::json out;
  out[kStreamGroup] = Summarize(streams, duration_s, percentiles);
  nlohmann::json& s = out[kStreamGroup];
  const double median = s["median_itl_ms"].get<double>();
  s["itl_max_over_median"] =
      median > 0 ? nlohmann::json(s["max_itl_ms"].get<double>() / median) : nlohmann::json(nullptr);
  out[kLongPromptGroup] = Summarize(long_prompts, duration_s, percentiles);
  out[kLongPromptGroup]["prefill_tokens_per_s"] =
      ttft_ms > 0 ? nlohmann::json(uncached / (ttft_ms / 1e3)) : nlohmann::json(nullptr);
  return out;
}

}  // namespace treespec::loadgen
