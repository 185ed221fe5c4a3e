// Flag parsing and validation: goodput SLOs in vLLM's syntax, percentiles, speculation modes,
// dataset kinds, and a message naming the flag for every bad value.
#include "tools/loadgen/run_config.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(ParseGoodputTest, ReadsVllmSyntax) {
  absl::StatusOr<Slo> slo = ParseGoodput("ttft:500 tpot:50.5,e2el:0");
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(*slo->ttft_ms, 500);
  EXPECT_EQ(*slo->tpot_ms, 50.5);
  EXPECT_EQ(*slo->e2el_ms, 0);
  absl::StatusOr<Slo> none = ParseGoodput("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->ttft_ms || none->tpot_ms || none->e2el_ms);
  absl::StatusOr<Slo> one = ParseGoodput("tpot:20");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->ttft_ms.has_value());
  EXPECT_EQ(*one->tpot_ms, 20);
}

TEST(ParseGoodputTest, RefusesBadItems) {
  const std::pair<const char*, const char*> cases[] = {
      {"ttft", "'ttft': expected KEY:MILLISECONDS"},
      {"ttft:", "expected KEY:MILLISECONDS"},
      {"ttft:-1", "'ttft:-1'"},
      {"ttft:fast", "'ttft:fast'"},
      {"ttft:inf", "'ttft:inf'"},
      {"itl:5", "unknown metric 'itl'"},
      {"ttft:1,ttft:2", "'ttft' given twice"},
  };
  for (const auto& [spec, message] : cases) {
    absl::StatusOr<Slo> slo = ParseGoodput(spec);
    EXPECT_EQ(slo.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(slo.status().message(), HasSubstr("--goodput")) << spec;
    EXPECT_THAT(slo.status().message(), HasSubstr(message)) << spec;
  }
}

TEST(ParsePercentilesTest, ReadsListsAndRefusesOutOfRange) {
  EXPECT_EQ(*ParsePercentiles("99"), std::vector<double>({99}));
  EXPECT_EQ(*ParsePercentiles("50, 90,99.9"), std::vector<double>({50, 90, 99.9}));
  EXPECT_THAT(ParsePercentiles("101").status().message(), HasSubstr("'101'"));
  EXPECT_THAT(ParsePercentiles("p99").status().message(), HasSubstr("'p99'"));
  EXPECT_THAT(ParsePercentiles("").status().message(), HasSubstr("--percentiles: empty"));
}

TEST(ParseModeTest, NamesEveryMode) {
  EXPECT_EQ(*ParseSpeculationMode("auto"), v1::SPECULATION_MODE_AUTO);
  EXPECT_EQ(*ParseSpeculationMode("off"), v1::SPECULATION_MODE_OFF);
  EXPECT_EQ(*ParseSpeculationMode("ngram"), v1::SPECULATION_MODE_NGRAM);
  EXPECT_EQ(*ParseSpeculationMode("draft_model"), v1::SPECULATION_MODE_DRAFT_MODEL);
  EXPECT_EQ(*ParseSpeculationMode("dflash"), v1::SPECULATION_MODE_DFLASH);
  for (const char* bad : {"", "AUTO", "tree", "speculation_mode_off"}) {
    EXPECT_THAT(ParseSpeculationMode(bad).status().message(),
                HasSubstr("expected auto, off, ngram, draft_model, dflash or replay"))
        << bad;
  }
}

TEST(ParseDatasetKindTest, DefaultsByPath) {
  EXPECT_EQ(*ParseDatasetKind("", ""), DatasetKind::kRandom);
  EXPECT_EQ(*ParseDatasetKind("", "p.jsonl"), DatasetKind::kJsonl);
  EXPECT_EQ(*ParseDatasetKind("random", ""), DatasetKind::kRandom);
  EXPECT_EQ(*ParseDatasetKind("jsonl", ""), DatasetKind::kJsonl);
  EXPECT_THAT(ParseDatasetKind("sharegpt", "").status().message(),
              HasSubstr("--dataset_name: 'sharegpt'"));
}

RunConfig Good() {
  RunConfig c;
  c.targets = {"127.0.0.1:50051"};
  return c;
}

TEST(ValidateRunConfigTest, AcceptsTheDefaultsAndNamesEachBadFlag) {
  EXPECT_TRUE(ValidateRunConfig(Good()).ok());
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<void (*)(RunConfig&), const char*> cases[] = {
      {[](RunConfig& c) { c.targets.clear(); }, "--target"},
      {[](RunConfig& c) {
         c.targets = {"a:1", ""};
       },
       "--target: an empty address"},
      {[](RunConfig& c) { c.num_prompts = 0; }, "--num_prompts: 0"},
      {[](RunConfig& c) { c.num_warmups = -1; }, "--num_warmups: -1"},
      {[](RunConfig& c) { c.request_rate = 0; }, "--request_rate: 0"},
      {[](RunConfig& c) { c.request_rate = std::nan(""); }, "--request_rate"},
      {[](RunConfig& c) { c.burstiness = 0; }, "--burstiness: 0"},
      {[](RunConfig& c) { c.max_concurrency = -2; }, "--max_concurrency: -2"},
      {[](RunConfig& c) { c.duration_s = -1; }, "--duration_s: -1"},
      {[](RunConfig& c) { c.request_timeout_s = 0; }, "--request_timeout_s: 0"},
      {[](RunConfig& c) { c.connect_timeout_s = -1; }, "--connect_timeout_s: -1"},
      {[](RunConfig& c) { c.cancel_fraction = 1.5; }, "--cancel_fraction: 1.5"},
      {[](RunConfig& c) { c.cancel_fraction = -0.1; }, "--cancel_fraction: -0.1"},
      {[](RunConfig& c) { c.cancel_fraction = std::nan(""); }, "--cancel_fraction"},
      {[](RunConfig& c) { c.cancel_delay_ms = -1; }, "--cancel_delay_ms: -1"},
      {[](RunConfig& c) { c.cancel_delay_ms = std::numeric_limits<double>::infinity(); },
       "--cancel_delay_ms: inf"},
      {[](RunConfig& c) { c.random_input_len = 0; }, "--random_input_len: 0"},
      {[](RunConfig& c) { c.random_output_len = -3; }, "--random_output_len: -3"},
      {[](RunConfig& c) { c.random_range_ratio = 1; }, "--random_range_ratio: 1"},
      {[](RunConfig& c) { c.random_vocab_size = -1; }, "--random_vocab_size: -1"},
      {[](RunConfig& c) { c.dataset_path = "p.jsonl"; }, "--dataset_path: set with"},
      {[](RunConfig& c) { c.dataset = DatasetKind::kJsonl; }, "--dataset_path: required"},
      {[](RunConfig& c) {
         c.dataset = DatasetKind::kJsonl;
         c.dataset_path = "p.jsonl";
         c.jsonl_output_len = 0;
       },
       "--jsonl_output_len: 0"},
      {[](RunConfig& c) {
         c.dataset = DatasetKind::kJsonl;
         c.dataset_path = "p.jsonl";
         c.record_tokens = "r.jsonl";
       },
       "--record_tokens: records token-id prompts only"},
      {[](RunConfig& c) { c.request.tree_budget = -1; }, "--tree_budget"},
      {[](RunConfig& c) { c.request.max_depth = -1; }, "--max_depth"},
      {[](RunConfig& c) { c.request.temperature = -0.5; }, "--temperature: -0.5"},
      {[](RunConfig& c) { c.request.top_p = 1.5; }, "--top_p: 1.5"},
      {[](RunConfig& c) { c.request.top_k = -1; }, "--top_k: -1"},
      {[](RunConfig& c) { c.metrics_urls = {"localhost"}; }, "--metrics_urls: metrics address"},
      {[](RunConfig& c) { c.check_metrics = true; }, "--check_metrics: needs --metrics_urls"},
  };
  for (const auto& [mutate, message] : cases) {
    RunConfig c = Good();
    mutate(c);
    const absl::Status s = ValidateRunConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  }
  RunConfig closed = Good();
  closed.request_rate = inf;
  closed.max_concurrency = 4;
  EXPECT_TRUE(ValidateRunConfig(closed).ok());
  RunConfig all_cancelled = Good();
  all_cancelled.cancel_fraction = 1;
  all_cancelled.cancel_delay_ms = 0;
  EXPECT_TRUE(ValidateRunConfig(all_cancelled).ok());
}

TEST(RunConfigJsonTest, WritesAnInfiniteRateAsText) {
  RunConfig c = Good();
  c.slo.tpot_ms = 50;
  c.request.mode = v1::SPECULATION_MODE_DRAFT_MODEL;
  const nlohmann::json j = ToJson(c);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["mode"], "draft_model");
  EXPECT_EQ(j["goodput"], nlohmann::json({{"tpot", 50.0}}));
  EXPECT_EQ(j["dataset_name"], "random");
  c.request_rate = 2.5;
  EXPECT_EQ(ToJson(c)["request_rate"], 2.5);
}

// The workloads' settings: parsed by name, each count checked only for its own workload, and
// written into the summary's config.
TEST(RunConfigTest, WorkloadsAreParsedCheckedAndWritten) {
  EXPECT_EQ(*ParseWorkloadKind("conversation"), WorkloadKind::kConversation);
  EXPECT_EQ(*ParseWorkloadKind("mixed"), WorkloadKind::kMixed);
  EXPECT_EQ(*ParseWorkloadKind("requests"), WorkloadKind::kRequests);
  EXPECT_FALSE(ParseWorkloadKind("").ok());
  RunConfig c = Good();
  c.turns = 0;  // not a conversation run: not checked
  c.streams = 0;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  EXPECT_FALSE(ToJson(c).contains("turns"));
  c.workload = WorkloadKind::kConversation;
  EXPECT_THAT(std::string(ValidateRunConfig(c).message()), HasSubstr("--turns: 0"));
  c.turns = 3;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  EXPECT_EQ(ToJson(c)["workload"], "conversation");
  EXPECT_EQ(ToJson(c)["turns"], 3);
  c.workload = WorkloadKind::kMixed;
  EXPECT_THAT(std::string(ValidateRunConfig(c).message()), HasSubstr("--streams: 0"));
  c.streams = 2;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  EXPECT_EQ(ToJson(c)["streams"], 2);
}

}  // namespace
}  // namespace treespec::loadgen
