// The metrics cross-check: counters read from a scrape, their deltas, the comparison with the
// harness's summary; and, against the verifier's real ServingMetrics served by the services'
// own HTTP server on loopback, that the names the harness reads are the ones the verifier
// writes and that a summary of the same requests matches the scraped deltas exactly.
#include "tools/loadgen/spec_counters.h"

#include <string>
#include <vector>

#include "common/metrics/metrics_http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/loadgen/serving_stats.h"
#include "verifier_service/serving_metrics.h"

namespace treespec::loadgen {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SpecCountersTest, ReadsTheCountersAndDepthLabels) {
  const std::vector<MetricSample> samples = *ParsePrometheusText(
      "treespec_spec_drafts_total 10\n"
      "treespec_spec_draft_tokens_total 160\n"
      "treespec_spec_accepted_tokens_total 25\n"
      "treespec_spec_accepted_tokens_by_depth_total{depth=\"3\"} 4\n"
      "treespec_spec_accepted_tokens_by_depth_total{depth=\"1\"} 9\n"
      "treespec_spec_accepted_tokens_by_depth_total{depth=\"2\"} 7\n"
      "treespec_requests_running 2\n");
  absl::StatusOr<SpecCounters> c = SpecCountersFromSamples(samples);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->drafts, 10);
  EXPECT_EQ(c->draft_tokens, 160);
  EXPECT_EQ(c->accepted_tokens, 25);
  EXPECT_THAT(c->accepted_per_depth, ElementsAre(9, 7, 4));
}

TEST(SpecCountersTest, RefusesForeignOrMalformedMetrics) {
  // A drafter's /metrics has no verifier counters.
  EXPECT_EQ(SpecCountersFromSamples(*ParsePrometheusText("treespec_drafter_sessions_total 3\n"))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(
      SpecCountersFromSamples(
          *ParsePrometheusText("treespec_spec_drafts_total 1\n"
                               "treespec_spec_accepted_tokens_by_depth_total{depth=\"0\"} 1\n"))
          .status()
          .message(),
      HasSubstr("depth label >= 1, got '0'"));
}

TEST(SpecCountersTest, AddsAndSubtracts) {
  const SpecCounters a = {
      .drafts = 5, .draft_tokens = 50, .accepted_tokens = 9, .accepted_per_depth = {5, 4}};
  const SpecCounters b = {
      .drafts = 2, .draft_tokens = 20, .accepted_tokens = 3, .accepted_per_depth = {1, 1, 1}};
  const SpecCounters sum = Add(a, b);
  EXPECT_EQ(sum.drafts, 7);
  EXPECT_EQ(sum.draft_tokens, 70);
  EXPECT_EQ(sum.accepted_tokens, 12);
  EXPECT_THAT(sum.accepted_per_depth, ElementsAre(6, 5, 1));
  const SpecCounters back = Subtract(sum, b);
  EXPECT_EQ(back.drafts, a.drafts);
  EXPECT_EQ(back.accepted_tokens, a.accepted_tokens);
  EXPECT_THAT(back.accepted_per_depth, ElementsAre(5, 4, 0));
  const nlohmann::json j = ToJson(back);
  EXPECT_EQ(j["spec_decode_accepted_tokens_per_position"], nlohmann::json({5.0, 4.0}))
      << "trailing zero depths dropped";
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_length"].get<double>(), 1.0 + 9.0 / 5);
  EXPECT_TRUE(ToJson(SpecCounters{})["spec_decode_acceptance_length"].is_null());
}

TEST(SpecCountersTest, ComparesWithTheSummaryFigureByFigure) {
  const nlohmann::json summary = {{"spec_decode_num_drafts", 7},
                                  {"spec_decode_draft_tokens", 70},
                                  {"spec_decode_accepted_tokens", 12},
                                  {"spec_decode_accepted_tokens_per_position", {6, 5, 1, 0}}};
  SpecCounters servers = {
      .drafts = 7, .draft_tokens = 70, .accepted_tokens = 12, .accepted_per_depth = {6, 5, 1}};
  EXPECT_TRUE(CompareWithSummary(summary, servers).empty());
  servers.drafts = 8;
  servers.accepted_per_depth = {6, 4, 1};
  EXPECT_THAT(CompareWithSummary(summary, servers),
              ElementsAre("spec_decode_num_drafts: harness 7, servers 8",
                          "spec_decode_accepted_tokens_per_position: harness [6,5,1], servers "
                          "[6,4,1]"));
}

// With cancelled requests the servers counted more than the harness saw: at least is enough,
// fewer is still a mismatch, and a depth the harness has but the servers lack is one too.
TEST(SpecCountersTest, ServersAtLeastAllowsMoreButNotFewer) {
  const nlohmann::json summary = {{"spec_decode_num_drafts", 7},
                                  {"spec_decode_draft_tokens", 70},
                                  {"spec_decode_accepted_tokens", 12},
                                  {"spec_decode_accepted_tokens_per_position", {6, 5, 1}}};
  const SpecMatch at_least = SpecMatch::kServersAtLeast;
  SpecCounters servers = {
      .drafts = 9, .draft_tokens = 90, .accepted_tokens = 12, .accepted_per_depth = {7, 5, 1, 2}};
  EXPECT_TRUE(CompareWithSummary(summary, servers, at_least).empty());
  EXPECT_EQ(CompareWithSummary(summary, servers).size(), 3u) << "not exact";
  servers.accepted_tokens = 11;
  servers.accepted_per_depth = {7, 5};
  EXPECT_THAT(CompareWithSummary(summary, servers, at_least),
              ElementsAre("spec_decode_accepted_tokens: harness 12, servers 11 (the servers "
                          "counted fewer)",
                          "spec_decode_accepted_tokens_per_position: harness [6,5,1], servers "
                          "[7,5] (the servers counted fewer)"));
}

// Two requests end on a verifier's ServingMetrics; the scrape's delta equals both the counts
// put in and the summary of the same requests as the harness would record them.
TEST(SpecCountersTest, ScrapedDeltaOfTheVerifiersMetricsMatchesTheSummary) {
  ServingMetrics metrics([] { return EngineSnapshot{}; });
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<HttpUrl> urls = {
      *ParseHttpUrl("127.0.0.1:" + std::to_string((*server)->port()))};

  GenerationUpdate earlier;  // before the run: must not count
  earlier.finished = true;
  earlier.stats = {
      .steps = 3, .drafted_tokens = 48, .accepted_tokens = 5, .accepted_per_depth = {3, 2}};
  metrics.OnFinished(earlier);
  absl::StatusOr<SpecCounters> before = ScrapeSpecCounters(urls);
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<RequestRecord> records;
  const SpecStats runs[] = {
      {.steps = 10,
       .drafted_tokens = 128,
       .accepted_tokens = 17,
       .fallback_steps = 2,
       .accepted_per_depth = {7, 6, 4}},
      {.steps = 4, .drafted_tokens = 64, .accepted_tokens = 5, .accepted_per_depth = {4, 1}},
  };
  for (const SpecStats& s : runs) {
    GenerationUpdate u;
    u.finished = true;
    u.stats = s;
    metrics.OnFinished(u);
    records.push_back({.ok = true,
                       .output_tokens = 2,
                       .drafts = s.steps - s.fallback_steps,
                       .draft_tokens = s.drafted_tokens,
                       .accepted_tokens = s.accepted_tokens,
                       .accepted_per_depth = s.accepted_per_depth});
  }
  absl::StatusOr<SpecCounters> after = ScrapeSpecCounters(urls);
  ASSERT_TRUE(after.ok()) << after.status();
  const SpecCounters delta = Subtract(*after, *before);
  EXPECT_EQ(delta.drafts, 8 + 4);
  EXPECT_EQ(delta.draft_tokens, 192);
  EXPECT_EQ(delta.accepted_tokens, 22);
  EXPECT_THAT(delta.accepted_per_depth, ElementsAre(11, 7, 4));
  const nlohmann::json summary = Summarize(records, 1.0, std::vector<double>{99});
  EXPECT_TRUE(CompareWithSummary(summary, delta).empty());
  // Two URLs naming the same server count it twice: a mismatch.
  const SpecCounters doubled = Subtract(*ScrapeSpecCounters({urls[0], urls[0]}), *before);
  EXPECT_FALSE(CompareWithSummary(summary, doubled).empty());
}

TEST(SpecCountersTest, ScrapeNamesTheFailingUrl) {
  // A port nothing listens on any more.
  int port = 0;
  {
    ServingMetrics metrics([] { return EngineSnapshot{}; });
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start("127.0.0.1", 0, &metrics);
    ASSERT_TRUE(server.ok()) << server.status();
    port = (*server)->port();
  }
  const absl::StatusOr<SpecCounters> c =
      ScrapeSpecCounters({*ParseHttpUrl("127.0.0.1:" + std::to_string(port))});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr(std::to_string(port)));
}

}  // namespace
}  // namespace treespec::loadgen
