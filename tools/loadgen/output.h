// treespec-loadgen's files: the per-request JSONL, the summary JSON and the one-row CSV (the
// summary flattened: nested keys joined by '.', lists joined by ';').
#ifndef TREESPEC_TOOLS_LOADGEN_OUTPUT_H_
#define TREESPEC_TOOLS_LOADGEN_OUTPUT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/request_result.h"

namespace treespec::loadgen {

// One request as a JSON object: index, request_id, target, attempts, send_s, send_unix_s, ok,
// error (failures only), cancelled, cancel_after_tokens or cancel_after_ms (when a cancel was
// planned), finish_reason, input_tokens, cached_tokens, output_tokens (for a cancelled request,
// those that arrived), ttft_ms, tpot_ms (null below 2 tokens), e2el_ms, itl_ms, and the
// speculation counts (drafts, draft_tokens, accepted_tokens, accepted_per_depth); with its
// `prompt`, the workload's conversation and turn (conversations only) and group (when set).
nlohmann::json RequestJson(const RequestResult& result, const Prompt* prompt = nullptr);

// One line per request, RequestJson each (with its prompt, by index, when `prompts` has it).
std::string RequestsJsonl(absl::Span<const RequestResult> results,
                          absl::Span<const Prompt> prompts = {});

// {"prompt_ids": [...], "output_ids": [...]} per completed request of `results` (by dataset
// index into `prompts`), one per line: the replay drafter's record (--record_tokens).
std::string TokenRecordsJsonl(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> results);

// A CSV field: quoted (with doubled quotes) when it holds a comma, quote, CR or LF.
std::string CsvField(absl::string_view value);

// The header line and the one data line of `summary` (a JSON object), each ending in "\n".
// Columns in the object's key order (nlohmann sorts them), nested objects flattened to
// "outer.inner", arrays to "a;b;c", null to an empty field.
std::string SummaryCsv(const nlohmann::json& summary);

// The summary as a human-readable table in the layout of vLLM's serving benchmark, with the
// speculation figures and the metrics cross-check (when the summary has one) at the end.
std::string SummaryReport(const nlohmann::json& summary, absl::Span<const double> percentiles);

// The workload's own figures (the summary's "turns" of a conversation run, "groups" of a mixed
// one) as a table; empty for other runs.
std::string WorkloadReport(const nlohmann::json& summary);

// Writes `contents` to `path` (created or truncated); UNAVAILABLE naming the path on failure.
absl::Status WriteFile(const std::string& path, absl::string_view contents);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_OUTPUT_H_
