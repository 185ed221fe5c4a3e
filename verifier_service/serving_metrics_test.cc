#include "verifier_service/serving_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServingMetricsTest, ExportsTheStepCostModelsScoreOnlyWithAModel) {
  EngineSnapshot snapshot;
  ServingMetrics metrics([&snapshot] { return snapshot; });
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("treespec_step_cost")));
  StepCostStats stats;
  stats.steps = 5;
  stats.predicted_ms = 10;
  stats.measured_ms = 11;
  stats.ratio_sum = 5.5;
  stats.ratio_counts[4] = 1;  // <= 1.0
  stats.ratio_counts[6] = 3;  // <= 1.1
  stats.drafted_nodes = 80;
  stats.verified_nodes = 30;
  stats.expected_accepted = 7.5;
  stats.accepted = 9;
  stats.auto_tree_steps = 12;
  stats.auto_plain_steps = 340;
  snapshot.step_cost = stats;  // one step above 4: only in +Inf
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_bucket{le=\"0.95\"} 0"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_bucket{le=\"1\"} 1"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_bucket{le=\"1.1\"} 4"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_bucket{le=\"4\"} 4"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_bucket{le=\"+Inf\"} 5"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_ratio_sum 5.5"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_predicted_seconds_total 0.01"));
  EXPECT_THAT(text, HasSubstr("treespec_step_cost_measured_seconds_total 0.011"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_drafted_nodes_total 80"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_verified_nodes_total 30"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_expected_accepted_tokens_total 7.5"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_accepted_tokens_total 9"));
  EXPECT_THAT(text, HasSubstr("treespec_auto_tree_steps_total 12"));
  EXPECT_THAT(text, HasSubstr("treespec_auto_plain_steps_total 340"));
}

}  // namespace
}  // namespace treespec
