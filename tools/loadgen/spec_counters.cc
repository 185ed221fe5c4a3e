#include "tools/loadgen/spec_counters.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace treespec::loadgen {
namespace {

constexpr char kDrafts[] = "treespec_spec_drafts_total";
constexpr char kDraftTokens[] = "treespec_spec_draft_tokens_total";
constexpr char kAccepted[] = "treespec_spec_accepted_tokens_total";
constexpr char kAcceptedByDepth[] = "treespec_spec_accepted_tokens_by_depth_total";

// `v` without its trailing zeros.
std::vector<double> TrimZeros(std::vector<double> v) {
  while (!v.empty() && v.back() == 0) v.pop_back();
  return v;
}

std::string Number(double x) {
  return x == std::floor(x) && std::abs(x) < 1e15 ? absl::StrCat(static_cast<int64_t>(x))
                                                  : absl::StrCat(x);
}

// a + scale · b.
SpecCounters AddScaled(const SpecCounters& a, const SpecCounters& b, double scale) {
  SpecCounters sum = a;
  sum.drafts += scale * b.drafts;
  sum.draft_tokens += scale * b.draft_tokens;
  sum.accepted_tokens += scale * b.accepted_tokens;
  sum.accepted_per_depth.resize(std::max(a.accepted_per_depth.size(), b.accepted_per_depth.size()));
  for (size_t d = 0; d < b.accepted_per_depth.size(); ++d) {
    sum.accepted_per_depth[d] += scale * b.accepted_per_depth[d];
  }
  return sum;
}

}  // namespace

absl::StatusOr<SpecCounters> SpecCountersFromSamples(absl::Span<const MetricSample> samples) {
  SpecCounters c;
  const SampleSum drafts = SumSamples(samples, kDrafts);
  if (drafts.count == 0) {
    return absl::NotFoundError(
        absl::StrCat("no ", kDrafts, " among the metrics: not a treespec verifier's /metrics?"));
  }
  c.drafts = drafts.sum;
  c.draft_tokens = SumSamples(samples, kDraftTokens).sum;
  c.accepted_tokens = SumSamples(samples, kAccepted).sum;
  for (const MetricSample& s : samples) {
    if (s.name != kAcceptedByDepth) continue;
    const auto label = s.labels.find("depth");
    int depth = 0;
    if (label == s.labels.end() || !absl::SimpleAtoi(label->second, &depth) || depth < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(kAcceptedByDepth, ": expected a depth label >= 1, got '",
                       label == s.labels.end() ? "" : label->second, "'"));
    }
    if (c.accepted_per_depth.size() < static_cast<size_t>(depth)) {
      c.accepted_per_depth.resize(depth, 0.0);
    }
    c.accepted_per_depth[depth - 1] += s.value;
  }
  return c;
}

SpecCounters Add(const SpecCounters& a, const SpecCounters& b) { return AddScaled(a, b, 1.0); }

SpecCounters Subtract(const SpecCounters& after, const SpecCounters& before) {
  return AddScaled(after, before, -1.0);
}

absl::StatusOr<SpecCounters> ScrapeSpecCounters(absl::Span<const HttpUrl> urls,
                                                absl::Duration timeout) {
  SpecCounters total;
  for (const HttpUrl& url : urls) {
    absl::StatusOr<std::string> text = HttpGet(url, timeout);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<MetricSample>> samples = ParsePrometheusText(*text);
    absl::StatusOr<SpecCounters> counters =
        samples.ok() ? SpecCountersFromSamples(*samples) : samples.status();
    if (!counters.ok()) {
      return absl::Status(
          counters.status().code(),
          absl::StrCat(url.host, ":", url.port, url.path, ": ", counters.status().message()));
    }
    total = Add(total, *counters);
  }
  return total;
}

nlohmann::json ToJson(const SpecCounters& c) {
  nlohmann::json j;
  j["spec_decode_num_drafts"] = c.drafts;
  j["spec_decode_draft_tokens"] = c.draft_tokens;
  j["spec_decode_accepted_tokens"] = c.accepted_tokens;
  j["spec_decode_accepted_tokens_per_position"] = TrimZeros(c.accepted_per_depth);
  j["spec_decode_acceptance_length"] =
      c.drafts > 0 ? nlohmann::json(1.0 + c.accepted_tokens / c.drafts) : nlohmann::json(nullptr);
  return j;
}

std::vector<std::string> CompareWithSummary(const nlohmann::json& summary,
                                            const SpecCounters& delta, SpecMatch match) {
  std::vector<std::string> mismatches;
  const bool exact = match == SpecMatch::kExact;
  const char* why = exact ? "" : " (the servers counted fewer)";
  auto agree = [&](double harness, double servers) {
    return exact ? harness == servers : servers >= harness;
  };
  auto compare = [&](const char* key, double servers) {
    const double harness = summary.value(key, 0.0);
    if (!agree(harness, servers)) {
      mismatches.push_back(
          absl::StrCat(key, ": harness ", Number(harness), ", servers ", Number(servers), why));
    }
  };
  compare("spec_decode_num_drafts", delta.drafts);
  compare("spec_decode_draft_tokens", delta.draft_tokens);
  compare("spec_decode_accepted_tokens", delta.accepted_tokens);
  std::vector<double> harness_depths;
  if (const auto it = summary.find("spec_decode_accepted_tokens_per_position");
      it != summary.end() && it->is_array()) {
    for (const nlohmann::json& x : *it) harness_depths.push_back(x.get<double>());
  }
  harness_depths = TrimZeros(std::move(harness_depths));
  const std::vector<double> server_depths = TrimZeros(delta.accepted_per_depth);
  bool depths_agree =
      exact ? harness_depths == server_depths : harness_depths.size() <= server_depths.size();
  for (size_t d = 0; depths_agree && d < harness_depths.size(); ++d) {
    depths_agree = agree(harness_depths[d], server_depths[d]);
  }
  if (!depths_agree) {
    auto join = [](const std::vector<double>& v) {
      return absl::StrJoin(v, ",", [](std::string* out, double x) { out->append(Number(x)); });
    };
    mismatches.push_back(absl::StrCat("spec_decode_accepted_tokens_per_position: harness [",
                                      join(harness_depths), "], servers [", join(server_depths),
                                      "]", why));
  }
  return mismatches;
}

}  // namespace treespec::loadgen
