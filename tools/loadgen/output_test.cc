// Output files: a request's JSONL line, CSV quoting, the one-row summary CSV (flattening and
// column order), the report's figures, and writing to an unwritable path.
#include "tools/loadgen/output.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Splits one CSV line into fields (RFC 4180 quoting), to check the writer from outside.
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

TEST(OutputTest, RequestJsonHasTheFiguresAndTheError) {
  RequestResult ok;
  ok.index = 4;
  ok.request_id = "loadgen-4";
  ok.target = "127.0.0.1:1";
  ok.attempts = 2;
  ok.send_s = 0.5;
  ok.finish_reason = "FINISH_REASON_LENGTH";
  ok.record = {.ok = true,
               .input_tokens = 10,
               .cached_tokens = 8,
               .output_tokens = 3,
               .ttft_ms = 20,
               .e2el_ms = 60,
               .itl_ms = {40},
               .drafts = 1,
               .draft_tokens = 16,
               .accepted_tokens = 1,
               .accepted_per_depth = {1}};
  const nlohmann::json j = RequestJson(ok);
  EXPECT_EQ(j["index"], 4);
  EXPECT_EQ(j["target"], "127.0.0.1:1");
  EXPECT_EQ(j["attempts"], 2);
  EXPECT_EQ(j["ok"], true);
  EXPECT_FALSE(j.contains("error"));
  EXPECT_DOUBLE_EQ(j["tpot_ms"].get<double>(), 20);  // (60 - 20) / 2
  EXPECT_EQ(j["itl_ms"], nlohmann::json({40.0}));
  EXPECT_EQ(j["accepted_per_depth"], nlohmann::json({1}));
  EXPECT_EQ(j["cached_tokens"], 8);
  EXPECT_FALSE(j.contains("conversation") || j.contains("turn") || j.contains("group"));
  // With its prompt: the workload's marks.
  Prompt turn;
  turn.conversation = 2;
  turn.turn = 3;
  const nlohmann::json t = RequestJson(ok, &turn);
  EXPECT_EQ(t["conversation"], 2);
  EXPECT_EQ(t["turn"], 3);
  Prompt stream;
  stream.group = "stream";
  EXPECT_EQ(RequestJson(ok, &stream)["group"], "stream");

  RequestResult failed;
  failed.error = "UNAVAILABLE: draining";
  failed.record.output_tokens = 1;
  const nlohmann::json f = RequestJson(failed);
  EXPECT_EQ(f["ok"], false);
  EXPECT_EQ(f["error"], "UNAVAILABLE: draining");
  EXPECT_TRUE(f["tpot_ms"].is_null());

  const std::string jsonl = RequestsJsonl(std::vector<RequestResult>{ok, failed});
  const std::vector<std::string> lines = absl::StrSplit(jsonl, '\n');
  ASSERT_EQ(lines.size(), 3u) << "two lines and the final newline";
  EXPECT_EQ(nlohmann::json::parse(lines[0]), j);
  EXPECT_EQ(nlohmann::json::parse(lines[1]), f);
  // Prompts by index: request 4 has none here, request 0 its turn.
  std::vector<Prompt> prompts(1);
  prompts[0] = turn;
  const std::string with_prompts = RequestsJsonl(std::vector<RequestResult>{ok, failed}, prompts);
  const std::vector<std::string> marked = absl::StrSplit(with_prompts, '\n');
  EXPECT_FALSE(nlohmann::json::parse(marked[0]).contains("turn"));
  EXPECT_EQ(nlohmann::json::parse(marked[1])["turn"], 3);
}

TEST(OutputTest, RequestJsonSaysWhatWasCancelledAndWhere) {
  RequestResult cancelled;
  cancelled.cancel = {.after_tokens = 5};
  cancelled.record.cancelled = true;
  cancelled.record.output_tokens = 6;  // a message of two tokens crossed the mark
  const nlohmann::json c = RequestJson(cancelled);
  EXPECT_EQ(c["ok"], false);
  EXPECT_EQ(c["cancelled"], true);
  EXPECT_FALSE(c.contains("error")) << "a cancel is not a failure";
  EXPECT_EQ(c["cancel_after_tokens"], 5);
  EXPECT_FALSE(c.contains("cancel_after_ms"));
  EXPECT_EQ(c["output_tokens"], 6);

  RequestResult planned;  // completed before its cancel came due
  planned.record.ok = true;
  planned.cancel = {.after_ms = 12.5};
  const nlohmann::json p = RequestJson(planned);
  EXPECT_EQ(p["cancelled"], false);
  EXPECT_EQ(p["cancel_after_ms"], 12.5);

  const nlohmann::json none = RequestJson(RequestResult{});
  EXPECT_FALSE(none.contains("cancel_after_tokens") || none.contains("cancel_after_ms"));
}

// The replay drafter's record: prompt and output ids of each completed request, by its index.
TEST(OutputTest, TokenRecordsHoldTheCompletedRequestsIds) {
  const std::vector<Prompt> prompts = {{"", {1, 2}, 4}, {"", {3}, 4}, {"", {5, 6, 7}, 4}};
  std::vector<RequestResult> results(3);
  results[0].index = 2;
  results[0].record.ok = true;
  results[0].record.output_ids = {8, 9};
  results[1].index = 0;  // failed: left out
  results[2].index = 1;
  results[2].record.ok = true;
  results[2].record.cancelled = true;  // cancelled: its output is cut short, left out
  EXPECT_EQ(TokenRecordsJsonl(prompts, results), "{\"output_ids\":[8,9],\"prompt_ids\":[5,6,7]}\n");
}

TEST(OutputTest, CsvFieldsAreQuotedOnlyWhenNeeded) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField(""), "");
}

TEST(OutputTest, SummaryCsvIsOneFlatRow) {
  const nlohmann::json summary = {
      {"completed", 3},
      {"mean_ttft_ms", 12.5},
      {"spec_decode_acceptance_length", nullptr},
      {"spec_decode_per_position_acceptance_rates", {0.5, 0.25}},
      {"config", {{"targets", {"a:1", "b:2"}}, {"mode", "auto"}}},
      {"errors", {{"UNAVAILABLE: x, y", 2}}},
  };
  const std::vector<std::string> lines = absl::StrSplit(SummaryCsv(summary), '\n');
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "");
  const std::vector<std::string> header = CsvFields(lines[0]);
  const std::vector<std::string> row = CsvFields(lines[1]);
  ASSERT_EQ(header.size(), row.size());
  const std::vector<std::string> expected_header = {"completed",
                                                    "config.mode",
                                                    "config.targets",
                                                    "errors.UNAVAILABLE: x, y",
                                                    "mean_ttft_ms",
                                                    "spec_decode_acceptance_length",
                                                    "spec_decode_per_position_acceptance_rates"};
  EXPECT_EQ(header, expected_header);
  const std::vector<std::string> expected_row = {"3",    "auto", "a:1;b:2", "2",
                                                 "12.5", "",     "0.5;0.25"};
  EXPECT_EQ(row, expected_row);
}

TEST(OutputTest, ReportShowsTheFigures) {
  const nlohmann::json summary = {{"completed", 200},
                                  {"failed", 0},
                                  {"duration", 12.345},
                                  {"mean_ttft_ms", 3.14159},
                                  {"p99.9_ttft_ms", 9.5},
                                  {"spec_decode_acceptance_length", 2.5},
                                  {"spec_decode_acceptance_rate", nullptr},
                                  {"spec_decode_per_position_acceptance_rates", {0.75, 0.5}},
                                  {"metrics_check", {{"ok", true}}}};
  const std::string report = SummaryReport(summary, std::vector<double>{99.9});
  EXPECT_THAT(report, HasSubstr("Successful requests:                     200\n"));
  EXPECT_THAT(report, HasSubstr("Benchmark duration (s):                  12.35\n"));
  EXPECT_THAT(report, HasSubstr("Mean TTFT (ms):                          3.14\n"));
  EXPECT_THAT(report, HasSubstr("P99.9 TTFT (ms):                         9.50\n"));
  EXPECT_THAT(report, HasSubstr("Mean acceptance length:                  2.50\n"));
  EXPECT_THAT(report, HasSubstr("Acceptance rate (%):                     n/a\n"));
  EXPECT_THAT(report, HasSubstr("Acceptance per depth:                    0.75 0.50\n"));
  EXPECT_THAT(report, HasSubstr("Server counters (delta):                 match\n"));
  EXPECT_THAT(report, Not(HasSubstr("Cancelled"))) << "no cancels, no line";
  nlohmann::json with_cancels = summary;
  with_cancels["cancelled"] = 7;
  with_cancels["metrics_check"]["comparison"] = "servers_at_least";
  const std::string cancelled_report = SummaryReport(with_cancels, std::vector<double>{99});
  EXPECT_THAT(cancelled_report, HasSubstr("Failed requests:                         0\n"
                                          "Cancelled requests:                      7\n"));
  EXPECT_THAT(cancelled_report, HasSubstr("match (servers >= harness: requests were cancelled)\n"));
}

TEST(OutputTest, WriteFileNamesAnUnwritablePath) {
  const std::string path = ::testing::TempDir() + "/loadgen_output_test.txt";
  ASSERT_TRUE(WriteFile(path, "abc\n").ok());
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "abc");
  const absl::Status bad = WriteFile("/nonexistent-dir/x.json", "{}");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("/nonexistent-dir/x.json"));
}

}  // namespace
}  // namespace treespec::loadgen
