#include "tools/loadgen/serving_stats.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace treespec::loadgen {
namespace {

double Mean(absl::Span<const double> v) {
  if (v.empty()) return 0;
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double StdDev(absl::Span<const double> v) {
  if (v.empty()) return 0;
  const double mean = Mean(v);
  double sum = 0;
  for (double x : v) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(v.size()));
}

// Percentile of values sorted ascending (the interpolation Percentile documents).
double SortedPercentile(absl::Span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

// "99" for 99, "99.9" for 99.9: vLLM's spelling of a percentile in key names.
std::string PercentileWord(double p) {
  if (p == std::floor(p)) return absl::StrCat(static_cast<int64_t>(p));
  return absl::StrCat(p);
}

// Sorts `values` (once, for the median and every percentile).
void AddMetric(nlohmann::json& out, const std::string& name, std::vector<double>& values,
               absl::Span<const double> percentiles) {
  std::sort(values.begin(), values.end());
  out[absl::StrCat("mean_", name, "_ms")] = Mean(values);
  out[absl::StrCat("median_", name, "_ms")] = SortedPercentile(values, 50);
  out[absl::StrCat("std_", name, "_ms")] = StdDev(values);
  out[absl::StrCat("max_", name, "_ms")] = values.empty() ? 0.0 : values.back();
  for (double p : percentiles) {
    out[absl::StrCat("p", PercentileWord(p), "_", name, "_ms")] = SortedPercentile(values, p);
  }
}

}  // namespace

double Percentile(absl::Span<const double> values, double p) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return SortedPercentile(sorted, p);
}

std::optional<double> Tpot(const RequestRecord& r) {
  if (r.output_tokens < 2) return std::nullopt;
  return (r.e2el_ms - r.ttft_ms) / (r.output_tokens - 1);
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok) return false;
  if (slo.ttft_ms && r.ttft_ms > *slo.ttft_ms) return false;
  if (slo.e2el_ms && r.e2el_ms > *slo.e2el_ms) return false;
  if (slo.tpot_ms) {
    const std::optional<double> tpot = Tpot(r);
    if (tpot && *tpot > *slo.tpot_ms) return false;
  }
  return true;
}

nlohmann::json Summarize(absl::Span<const RequestRecord> records, double duration_s,
                         absl::Span<const double> percentiles, const Slo& slo) {
  int completed = 0, failed = 0, cancelled = 0, good = 0;
  int64_t input = 0, cached = 0, output = 0, drafts = 0, draft_tokens = 0, accepted = 0;
  std::vector<int64_t> per_depth;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (r.cancelled) {
      ++cancelled;
      continue;
    }
    if (!r.ok) {
      ++failed;
      continue;
    }
    ++completed;
    good += MeetsSlo(r, slo) ? 1 : 0;
    input += r.input_tokens;
    cached += r.cached_tokens;
    output += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2el.push_back(r.e2el_ms);
    if (const std::optional<double> t = Tpot(r)) tpot.push_back(*t);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    drafts += r.drafts;
    draft_tokens += r.draft_tokens;
    accepted += r.accepted_tokens;
    if (per_depth.size() < r.accepted_per_depth.size()) {
      per_depth.resize(r.accepted_per_depth.size(), 0);
    }
    for (size_t d = 0; d < r.accepted_per_depth.size(); ++d)
      per_depth[d] += r.accepted_per_depth[d];
  }
  const double seconds = duration_s > 0 ? duration_s : 0;
  auto per_second = [&](double x) { return seconds > 0 ? x / seconds : 0.0; };
  nlohmann::json out;
  out["duration"] = duration_s;
  out["completed"] = completed;
  out["failed"] = failed;
  out["cancelled"] = cancelled;
  out["total_input_tokens"] = input;
  out["total_cached_tokens"] = cached;
  out["prefix_cache_hit_rate"] =
      input > 0 ? nlohmann::json(static_cast<double>(cached) / input) : nlohmann::json(nullptr);
  out["total_output_tokens"] = output;
  out["request_throughput"] = per_second(completed);
  if (slo.ttft_ms || slo.tpot_ms || slo.e2el_ms) out["request_goodput"] = per_second(good);
  out["output_throughput"] = per_second(static_cast<double>(output));
  out["total_token_throughput"] = per_second(static_cast<double>(input + output));
  AddMetric(out, "ttft", ttft, percentiles);
  AddMetric(out, "tpot", tpot, percentiles);
  AddMetric(out, "itl", itl, percentiles);
  AddMetric(out, "e2el", e2el, percentiles);
  out["spec_decode_num_drafts"] = drafts;
  out["spec_decode_draft_tokens"] = draft_tokens;
  out["spec_decode_accepted_tokens"] = accepted;
  // Undefined without drafts: null rather than a number that looks measured.
  out["spec_decode_acceptance_rate"] =
      draft_tokens > 0 ? nlohmann::json(100.0 * static_cast<double>(accepted) / draft_tokens)
                       : nlohmann::json(nullptr);
  out["spec_decode_acceptance_length"] =
      drafts > 0 ? nlohmann::json(1.0 + static_cast<double>(accepted) / drafts)
                 : nlohmann::json(nullptr);
  std::vector<double> per_position;
  for (int64_t a : per_depth) {
    per_position.push_back(drafts > 0 ? static_cast<double>(a) / drafts : 0.0);
  }
  out["spec_decode_per_position_acceptance_rates"] = per_position;
  // The counts behind the rates, to compare with the servers' counters exactly.
  out["spec_decode_accepted_tokens_per_position"] = per_depth;
  return out;
}

}  // namespace treespec::loadgen
