// The load test's summary math on hand-computed fixtures: percentiles (numpy's interpolation),
// TPOT vs ITL for a speculative request whose messages carry several tokens, goodput under
// each kind of SLO, the percentile key names, and the speculation figures.
#include "tools/loadgen/serving_stats.h"

#include <vector>

#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 3.97);  // rank 0.99 · 3 = 2.97
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{5}, 99), 5);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{}, 99), 0);
}

// r1: first token at 100 ms, then a message of 3 tokens at 150 ms and one of 2 at 200 ms (6
// tokens); r2: one token at 80 ms; r3 failed.
std::vector<RequestRecord> Fixture() {
  RequestRecord r1;
  r1.ok = true;
  r1.input_tokens = 10;
  r1.output_tokens = 6;
  r1.ttft_ms = 100;
  r1.e2el_ms = 200;
  r1.itl_ms = {50, 50};
  r1.drafts = 2;
  r1.draft_tokens = 32;
  r1.accepted_tokens = 5;
  r1.accepted_per_depth = {2, 2, 1};
  RequestRecord r2;
  r2.ok = true;
  r2.input_tokens = 20;
  r2.cached_tokens = 16;
  r2.output_tokens = 1;
  r2.ttft_ms = 80;
  r2.e2el_ms = 80;
  r2.drafts = 1;
  r2.draft_tokens = 16;
  RequestRecord r3;
  r3.ok = false;
  r3.input_tokens = 99;
  r3.cached_tokens = 64;  // a failure's count nothing
  r3.output_tokens = 7;
  r3.ttft_ms = 1;
  return {r1, r2, r3};
}

TEST(SummarizeTest, TpotIsPerTokenWhileItlIsPerMessage) {
  const std::vector<RequestRecord> records = Fixture();
  EXPECT_DOUBLE_EQ(*Tpot(records[0]), 20);  // (200 - 100) / 5
  EXPECT_FALSE(Tpot(records[1]).has_value());
  const nlohmann::json s = Summarize(records, 2.0, std::vector<double>{99});
  EXPECT_EQ(s["completed"], 2);
  EXPECT_EQ(s["failed"], 1);
  EXPECT_EQ(s["total_input_tokens"], 30);
  EXPECT_EQ(s["total_cached_tokens"], 16);
  EXPECT_DOUBLE_EQ(s["prefix_cache_hit_rate"].get<double>(), 16.0 / 30);
  EXPECT_DOUBLE_EQ(s["max_ttft_ms"].get<double>(), 100);
  EXPECT_EQ(s["total_output_tokens"], 7);
  EXPECT_DOUBLE_EQ(s["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["output_throughput"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(s["total_token_throughput"].get<double>(), 18.5);
  EXPECT_DOUBLE_EQ(s["mean_tpot_ms"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(s["mean_itl_ms"].get<double>(), 50);
  EXPECT_DOUBLE_EQ(s["median_ttft_ms"].get<double>(), 90);
  EXPECT_DOUBLE_EQ(s["std_ttft_ms"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(s["mean_e2el_ms"].get<double>(), 140);
  EXPECT_DOUBLE_EQ(s["p99_e2el_ms"].get<double>(), 198.8);  // 80 + 0.99 · 120
  EXPECT_FALSE(s.contains("request_goodput")) << "no SLO given";
}

TEST(SummarizeTest, CancelledRequestsAreCountedApartAndLeftOutOfTheFigures) {
  std::vector<RequestRecord> records = Fixture();
  RequestRecord cancelled;  // slow and speculative: would move every figure if it counted
  cancelled.cancelled = true;
  cancelled.input_tokens = 1000;
  cancelled.output_tokens = 40;
  cancelled.ttft_ms = 5000;
  cancelled.e2el_ms = 9000;
  cancelled.itl_ms = {4000};
  cancelled.drafts = 10;
  cancelled.draft_tokens = 160;
  cancelled.accepted_per_depth = {9, 9, 9, 9};
  records.push_back(cancelled);
  const nlohmann::json with = Summarize(records, 2.0, std::vector<double>{99}, {.ttft_ms = 1e9});
  const nlohmann::json without =
      Summarize(Fixture(), 2.0, std::vector<double>{99}, {.ttft_ms = 1e9});
  EXPECT_EQ(with["cancelled"], 1);
  EXPECT_EQ(without["cancelled"], 0);
  nlohmann::json rest = with;
  rest["cancelled"] = 0;
  EXPECT_EQ(rest, without) << "completed, failed, tokens, latencies, goodput and speculation";
}

TEST(SummarizeTest, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<RequestRecord> records = Fixture();
  const std::vector<double> p = {99};
  EXPECT_DOUBLE_EQ(Summarize(records, 2.0, p, {.ttft_ms = 90})["request_goodput"].get<double>(),
                   0.5);  // r2 only
  // r1's TPOT (20) misses; r2 has no TPOT, so that SLO does not apply to it.
  EXPECT_DOUBLE_EQ(Summarize(records, 2.0, p, {.tpot_ms = 10})["request_goodput"].get<double>(),
                   0.5);
  EXPECT_DOUBLE_EQ(Summarize(records, 2.0, p, {.e2el_ms = 200})["request_goodput"].get<double>(),
                   1.0);
  EXPECT_DOUBLE_EQ(
      Summarize(records, 2.0, p, {.ttft_ms = 90, .e2el_ms = 50})["request_goodput"].get<double>(),
      0.0);
  EXPECT_FALSE(MeetsSlo(records[2], {})) << "a failed request is never good";
}

TEST(SummarizeTest, PercentileKeysFollowVllmSpelling) {
  const nlohmann::json s = Summarize(Fixture(), 2.0, std::vector<double>{50, 99.9});
  for (const char* key : {"p50_ttft_ms", "p99.9_ttft_ms", "p50_tpot_ms", "p99.9_itl_ms",
                          "p99.9_e2el_ms", "mean_itl_ms", "std_e2el_ms"}) {
    EXPECT_TRUE(s.contains(key)) << key;
  }
}

TEST(SummarizeTest, SpeculationFigures) {
  const nlohmann::json s = Summarize(Fixture(), 2.0, std::vector<double>{99});
  EXPECT_EQ(s["spec_decode_num_drafts"], 3);
  EXPECT_EQ(s["spec_decode_draft_tokens"], 48);
  EXPECT_EQ(s["spec_decode_accepted_tokens"], 5);
  EXPECT_NEAR(s["spec_decode_acceptance_rate"].get<double>(), 100.0 * 5 / 48, 1e-12);
  EXPECT_NEAR(s["spec_decode_acceptance_length"].get<double>(), 1.0 + 5.0 / 3, 1e-12);
  const std::vector<double> per_position = s["spec_decode_per_position_acceptance_rates"];
  ASSERT_EQ(per_position.size(), 3u);
  EXPECT_NEAR(per_position[0], 2.0 / 3, 1e-12);
  EXPECT_NEAR(per_position[2], 1.0 / 3, 1e-12);
  EXPECT_EQ(s["spec_decode_accepted_tokens_per_position"], nlohmann::json({2, 2, 1}));
  // Without drafts the rate and length are undefined, not 0.
  std::vector<RequestRecord> plain = Fixture();
  for (RequestRecord& r : plain) r.drafts = r.draft_tokens = r.accepted_tokens = 0;
  const nlohmann::json none = Summarize(plain, 2.0, std::vector<double>{99});
  EXPECT_TRUE(none["spec_decode_acceptance_length"].is_null());
  EXPECT_TRUE(none["spec_decode_acceptance_rate"].is_null());
}

}  // namespace
}  // namespace treespec::loadgen
