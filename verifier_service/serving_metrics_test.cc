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
  SelectionCounts& draft_model = stats.Of(DrafterKind::kDraftModel);
  draft_model.drafted_nodes = 80;
  draft_model.verified_nodes = 30;
  draft_model.expected_accepted = 7.5;
  draft_model.accepted = 9;
  draft_model.auto_tree_steps = 12;
  draft_model.auto_plain_steps = 340;
  stats.Of(std::nullopt).drafted_nodes = 5;  // AUTO sessions
  stats.Of(std::nullopt).auto_plain_steps = 7;
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
  EXPECT_THAT(text, HasSubstr("treespec_selection_drafted_nodes_total{kind=\"draft_model\"} 80"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_drafted_nodes_total{kind=\"auto\"} 5"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_verified_nodes_total{kind=\"draft_model\"} 30"));
  EXPECT_THAT(
      text,
      HasSubstr("treespec_selection_expected_accepted_tokens_total{kind=\"draft_model\"} 7.5"));
  EXPECT_THAT(text, HasSubstr("treespec_selection_accepted_tokens_total{kind=\"draft_model\"} 9"));
  EXPECT_THAT(text, HasSubstr("treespec_auto_tree_steps_total{kind=\"draft_model\"} 12"));
  EXPECT_THAT(text, HasSubstr("treespec_auto_plain_steps_total{kind=\"draft_model\"} 340"));
  EXPECT_THAT(text, HasSubstr("treespec_auto_plain_steps_total{kind=\"auto\"} 7"));
  EXPECT_THAT(text, Not(HasSubstr("kind=\"ngram\""))) << "kinds that counted nothing";
}

}  // namespace
}  // namespace treespec
