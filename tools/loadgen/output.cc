#include "tools/loadgen/output.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/loadgen/mixed_load.h"

namespace treespec::loadgen {
namespace {

// A scalar as CSV text: strings as they are, numbers and booleans as JSON writes them.
std::string Scalar(const nlohmann::json& value) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

// Appends `value` under `key` to the columns (objects recurse, arrays join with ';').
void Flatten(const std::string& key, const nlohmann::json& value,
             std::vector<std::pair<std::string, std::string>>& columns) {
  if (value.is_object()) {
    for (const auto& [inner, v] : value.items()) {
      Flatten(key.empty() ? inner : absl::StrCat(key, ".", inner), v, columns);
    }
    return;
  }
  if (value.is_array()) {
    columns.emplace_back(key, absl::StrJoin(value, ";", [](std::string* out, const auto& v) {
                           out->append(v.is_structured() ? v.dump() : Scalar(v));
                         }));
    return;
  }
  columns.emplace_back(key, Scalar(value));
}

}  // namespace

nlohmann::json RequestJson(const RequestResult& result, const Prompt* prompt) {
  const RequestRecord& r = result.record;
  nlohmann::json j;
  j["index"] = result.index;
  if (prompt != nullptr && prompt->conversation >= 0) {
    j["conversation"] = prompt->conversation;
    j["turn"] = prompt->turn;
  }
  if (prompt != nullptr && !prompt->group.empty()) j["group"] = prompt->group;
  j["request_id"] = result.request_id;
  j["target"] = result.target;
  j["attempts"] = result.attempts;
  j["send_s"] = result.send_s;
  j["send_unix_s"] = result.send_unix_s;
  j["ok"] = r.ok;
  if (!r.ok && !r.cancelled) j["error"] = result.error;
  j["cancelled"] = r.cancelled;
  // The plan, whether or not the request ended before it came due.
  if (result.cancel.after_tokens > 0) {
    j["cancel_after_tokens"] = result.cancel.after_tokens;
  } else if (result.cancel.after_ms >= 0) {
    j["cancel_after_ms"] = result.cancel.after_ms;
  }
  j["finish_reason"] = result.finish_reason;
  j["input_tokens"] = r.input_tokens;
  j["cached_tokens"] = r.cached_tokens;
  j["output_tokens"] = r.output_tokens;
  j["ttft_ms"] = r.ttft_ms;
  const std::optional<double> tpot = Tpot(r);
  j["tpot_ms"] = tpot ? nlohmann::json(*tpot) : nlohmann::json(nullptr);
  j["e2el_ms"] = r.e2el_ms;
  j["itl_ms"] = r.itl_ms;
  j["drafts"] = r.drafts;
  j["draft_tokens"] = r.draft_tokens;
  j["accepted_tokens"] = r.accepted_tokens;
  j["accepted_per_depth"] = r.accepted_per_depth;
  return j;
}

std::string RequestsJsonl(absl::Span<const RequestResult> results,
                          absl::Span<const Prompt> prompts) {
  std::string out;
  for (const RequestResult& r : results) {
    const Prompt* prompt =
        r.index >= 0 && static_cast<size_t>(r.index) < prompts.size() ? &prompts[r.index] : nullptr;
    absl::StrAppend(&out, RequestJson(r, prompt).dump(), "\n");
  }
  return out;
}

std::string TokenRecordsJsonl(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> results) {
  std::string out;
  for (const RequestResult& r : results) {
    if (!r.record.ok || r.record.cancelled) continue;
    const nlohmann::json j = {{"prompt_ids", prompts[r.index].token_ids},
                              {"output_ids", r.record.output_ids}};
    absl::StrAppend(&out, j.dump(), "\n");
  }
  return out;
}

std::string CsvField(absl::string_view value) {
  if (value.find_first_of(",\"\r\n") == absl::string_view::npos) return std::string(value);
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string SummaryCsv(const nlohmann::json& summary) {
  std::vector<std::pair<std::string, std::string>> columns;
  Flatten("", summary, columns);
  std::string header, row;
  for (size_t i = 0; i < columns.size(); ++i) {
    const char* sep = i == 0 ? "" : ",";
    absl::StrAppend(&header, sep, CsvField(columns[i].first));
    absl::StrAppend(&row, sep, CsvField(columns[i].second));
  }
  return absl::StrCat(header, "\n", row, "\n");
}

std::string SummaryReport(const nlohmann::json& summary, absl::Span<const double> percentiles) {
  std::string out;
  auto title = [&](absl::string_view text, char fill) {
    const size_t width = 50, pad = width > text.size() ? width - text.size() : 0;
    absl::StrAppend(&out, std::string(pad / 2, fill), text, std::string(pad - pad / 2, fill), "\n");
  };
  auto row = [&](absl::string_view label, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-41s%s\n", label, value));
  };
  auto number = [&](const char* key) -> std::string {
    const auto it = summary.find(key);
    if (it == summary.end() || it->is_null()) return "n/a";
    if (it->is_number_integer()) return absl::StrCat(it->get<int64_t>());
    return absl::StrFormat("%.2f", it->get<double>());
  };
  title(" Serving Benchmark Result ", '=');
  row("Successful requests:", number("completed"));
  row("Failed requests:", number("failed"));
  if (summary.value("cancelled", 0) > 0) row("Cancelled requests:", number("cancelled"));
  row("Benchmark duration (s):", number("duration"));
  row("Total input tokens:", number("total_input_tokens"));
  row("Cached input tokens (prefix cache):", number("total_cached_tokens"));
  row("Total generated tokens:", number("total_output_tokens"));
  row("Request throughput (req/s):", number("request_throughput"));
  if (summary.contains("request_goodput"))
    row("Request goodput (req/s):", number("request_goodput"));
  row("Output token throughput (tok/s):", number("output_throughput"));
  row("Total Token throughput (tok/s):", number("total_token_throughput"));
  const std::pair<const char*, const char*> sections[] = {
      {"ttft", "Time to First Token"},
      {"tpot", "Time per Output Token (excl. 1st token)"},
      {"itl", "Inter-token Latency"},
      {"e2el", "End-to-end Latency"}};
  for (const auto& [key, name] : sections) {
    title(name, '-');
    const std::string upper = absl::AsciiStrToUpper(key);
    row(absl::StrCat("Mean ", upper, " (ms):"), number(absl::StrCat("mean_", key, "_ms").c_str()));
    row(absl::StrCat("Median ", upper, " (ms):"),
        number(absl::StrCat("median_", key, "_ms").c_str()));
    for (double p : percentiles) {
      const std::string word = absl::StrCat(p);
      row(absl::StrCat("P", word, " ", upper, " (ms):"),
          number(absl::StrCat("p", word, "_", key, "_ms").c_str()));
    }
  }
  title(" Speculative Decoding ", '-');
  row("Drafts:", number("spec_decode_num_drafts"));
  row("Draft tokens:", number("spec_decode_draft_tokens"));
  row("Accepted tokens:", number("spec_decode_accepted_tokens"));
  row("Acceptance rate (%):", number("spec_decode_acceptance_rate"));
  row("Mean acceptance length:", number("spec_decode_acceptance_length"));
  if (const auto rates = summary.find("spec_decode_per_position_acceptance_rates");
      rates != summary.end() && !rates->empty()) {
    row("Acceptance per depth:",
        absl::StrJoin(*rates, " ", [](std::string* o, const nlohmann::json& x) {
          absl::StrAppend(o, absl::StrFormat("%.2f", x.get<double>()));
        }));
  }
  if (const auto check = summary.find("metrics_check"); check != summary.end()) {
    std::string verdict = check->value("ok", false) ? "match" : "MISMATCH";
    if (check->value("comparison", "") == "servers_at_least") {
      absl::StrAppend(&verdict, " (servers >= harness: requests were cancelled)");
    }
    if (check->contains("error"))
      verdict = absl::StrCat("failed: ", (*check)["error"].get<std::string>());
    row("Server counters (delta):", verdict);
  }
  title("", '=');
  return out;
}

std::string WorkloadReport(const nlohmann::json& summary) {
  std::string out;
  auto value = [](const nlohmann::json& j, const char* key, const char* format) -> std::string {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "n/a";
    return absl::StrFormat(format, it->get<double>());
  };
  if (const auto turns = summary.find("turns"); turns != summary.end()) {
    absl::StrAppend(&out, "Per turn: TTFT (ms) and prefix-cache reuse\n",
                    absl::StrFormat("%5s %9s %10s %10s %10s %12s %12s %8s\n", "turn", "requests",
                                    "mean", "median", "max", "input tok", "cached tok", "reused"));
    for (const nlohmann::json& t : *turns) {
      absl::StrAppend(
          &out, absl::StrFormat("%5d %9d %10s %10s %10s %12d %12d %8s\n", t["turn"].get<int>(),
                                t["completed"].get<int>(), value(t, "mean_ttft_ms", "%.2f"),
                                value(t, "median_ttft_ms", "%.2f"), value(t, "max_ttft_ms", "%.2f"),
                                t["total_input_tokens"].get<int64_t>(),
                                t["total_cached_tokens"].get<int64_t>(),
                                value(t, "reused_share", "%.3f")));
    }
  }
  if (const auto groups = summary.find("groups"); groups != summary.end()) {
    const nlohmann::json& s = (*groups)[kStreamGroup];
    const nlohmann::json& l = (*groups)[kLongPromptGroup];
    absl::StrAppend(&out, "Mixed load\n",
                    absl::StrFormat("  streams: %d, inter-token gap median %s ms, p99 %s ms, max "
                                    "%s ms (max / median %s)\n",
                                    s["completed"].get<int>(), value(s, "median_itl_ms", "%.2f"),
                                    value(s, "p99_itl_ms", "%.2f"), value(s, "max_itl_ms", "%.2f"),
                                    value(s, "itl_max_over_median", "%.2f")),
                    absl::StrFormat("  long prompts: %d, TTFT mean %s ms, median %s ms; prefill "
                                    "%s tokens/s\n",
                                    l["completed"].get<int>(), value(l, "mean_ttft_ms", "%.2f"),
                                    value(l, "median_ttft_ms", "%.2f"),
                                    value(l, "prefill_tokens_per_s", "%.0f")));
  }
  return out;
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace treespec::loadgen
