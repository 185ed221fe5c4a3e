// Prometheus text exposition: samples with and without labels, escapes in label values,
// special values, timestamps, comments; label-matching sums; malformed lines refused with
// their line number.
#include "tools/loadgen/prometheus_text.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(PrometheusTextTest, ParsesSamplesLabelsAndSpecialValues) {
  const std::string text =
      "# HELP treespec_requests_total Ended requests\n"
      "# TYPE treespec_requests_total counter\n"
      "treespec_requests_total{reason=\"length\"} 12\n"
      "treespec_requests_total{reason=\"error\"} 1 1712345678901\n"
      "\n"
      "treespec_requests_running 3\n"
      "h_bucket{le=\"+Inf\",part=\"a \\\"b\\\" \\\\ c\\nd\"} +Inf\n"
      "g{ a = \"1\" , b=\"2\",} -1.5e3\n"
      "n NaN\n";
  absl::StatusOr<std::vector<MetricSample>> samples = ParsePrometheusText(text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 6u);
  EXPECT_EQ((*samples)[0].name, "treespec_requests_total");
  EXPECT_EQ((*samples)[0].labels.at("reason"), "length");
  EXPECT_EQ((*samples)[0].value, 12);
  EXPECT_EQ((*samples)[1].value, 1) << "the timestamp is not the value";
  EXPECT_TRUE((*samples)[2].labels.empty());
  EXPECT_EQ((*samples)[3].labels.at("part"), "a \"b\" \\ c\nd");
  EXPECT_TRUE(std::isinf((*samples)[3].value));
  EXPECT_EQ((*samples)[4].labels.at("a"), "1");
  EXPECT_EQ((*samples)[4].labels.at("b"), "2");
  EXPECT_EQ((*samples)[4].value, -1500);
  EXPECT_TRUE(std::isnan((*samples)[5].value));
}

TEST(PrometheusTextTest, SumsMatchingSamples) {
  const std::vector<MetricSample> samples = *ParsePrometheusText(
      "c{depth=\"1\",x=\"a\"} 5\nc{depth=\"2\",x=\"a\"} 3\nc{depth=\"2\",x=\"b\"} 1\nd 7\n");
  EXPECT_EQ(SumSamples(samples, "c").sum, 9);
  EXPECT_EQ(SumSamples(samples, "c").count, 3);
  EXPECT_EQ(SumSamples(samples, "c", {{"depth", "2"}}).sum, 4);
  EXPECT_EQ(SumSamples(samples, "c", {{"depth", "2"}, {"x", "b"}}).sum, 1);
  EXPECT_EQ(SumSamples(samples, "c", {{"nope", "1"}}).count, 0);
  EXPECT_EQ(SumSamples(samples, "missing").count, 0);
}

TEST(PrometheusTextTest, RefusesMalformedLinesNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {"ok 1\n9bad 1\n", "line 2"},
      {"m{a=\"1\" 2\n", "expected ',' or '}' after label a"},
      {"m{a=1} 2\n", "label a: expected '\"'"},
      {"m{a=\"1} 2\n", "unterminated"},
      {"m{a=\"\\x\"} 2\n", "unknown escape"},
      {"m{a=\"1\",a=\"2\"} 2\n", "label a given twice"},
      {"m\n", "expected a value"},
      {"m one\n", "value 'one' is not a number"},
      {"m 1 2 3\n", "expected a value and an optional time"},
      {"m 1 later\n", "timestamp 'later'"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<std::vector<MetricSample>> parsed = ParsePrometheusText(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace treespec::loadgen
