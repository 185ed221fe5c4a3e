#include "verifier_service/step_cost_model.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;

// A cost that is linear in each axis (with cross terms), which trilinear interpolation and the
// last segment's extension reproduce exactly: weights streamed once, rows × weights, context
// read per sequence.
double Multilinear(double batch, double drafted, double context) {
  return 2.0 + 0.25 * batch + 0.05 * batch * drafted + 0.001 * batch * context +
         1e-5 * batch * drafted * context;
}

StepCostGrid Grid() { return {{1, 2, 8}, {0, 1, 4, 16}, {64, 512, 4096}}; }

std::vector<double> Sample(const StepCostGrid& g) {
  std::vector<double> ms(g.size());
  for (size_t b = 0; b < g.batch.size(); ++b) {
    for (size_t d = 0; d < g.drafted.size(); ++d) {
      for (size_t c = 0; c < g.context.size(); ++c) {
        ms[g.Index(b, d, c)] = Multilinear(g.batch[b], g.drafted[d], g.context[c]);
      }
    }
  }
  return ms;
}

StepCostModel MakeModel() {
  absl::StatusOr<StepCostModel> m = StepCostModel::Create(Grid(), Sample(Grid()));
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(StepCostModelTest, InterpolatesBetweenAndExtendsBeyondTheGrid) {
  const StepCostModel m = MakeModel();
  for (double b : {1.0, 2.0, 5.0, 8.0, 12.0}) {
    for (double d : {0.0, 0.5, 3.0, 10.0, 16.0, 40.0}) {
      for (double c : {64.0, 100.0, 3000.0, 9000.0}) {
        EXPECT_NEAR(m.PredictMs({static_cast<int>(b), d, c}), Multilinear(b, d, c),
                    1e-9 * Multilinear(b, d, c))
            << "batch " << b << ", drafted " << d << ", context " << c;
      }
    }
  }
  // Below an axis's first point the model holds that point's value.
  EXPECT_DOUBLE_EQ(m.PredictMs({1, 0, 10}), Multilinear(1, 0, 64));
}

// A step that prefills prompts is priced for them at the whole step's prediction less that of
// its verify members: the gate scores such a step without them.
TEST(StepCostModelTest, PricesAStepsPromptsAsItsPredictionBeyondItsVerifyMembers) {
  const StepCostModel m = MakeModel();
  // Two members verifying one drafted node each at 512 tokens, and a 17-token prompt (16 rows
  // past its first, no context).
  const StepShape verify{2, 1.0, 512.0};
  const StepShape step{3, (2 * 1.0 + 16) / 3, (2 * 512.0) / 3};
  const double prompts = m.PromptsMs(step, verify);
  EXPECT_NEAR(prompts, Multilinear(3, step.drafted, step.context) - Multilinear(2, 1, 512), 1e-9);
  EXPECT_GT(prompts, 0.05 * 16) << "at least its rows' share";
  EXPECT_DOUBLE_EQ(m.PromptsMs(step, {}), m.PredictMs(step)) << "a step of prompts only";
  // A one-token prompt averaged into long trees lowers the cross term more than it adds.
  const StepShape deep{2, 16.0, 4096.0};
  EXPECT_LT(Multilinear(3, 32.0 / 3, 8192.0 / 3), Multilinear(2, 16, 4096));
  EXPECT_EQ(m.PromptsMs({3, 32.0 / 3, 8192.0 / 3}, deep), 0.0);
}

TEST(StepCostModelTest, ObservedStepsPullTheirNeighbourhoodTowardTheMeasuredTime) {
  StepCostModel m = MakeModel();
  const StepShape shape{2, 2.5, 300};
  const StepShape far{8, 16, 4096};
  const double before = m.PredictMs(shape), far_before = m.PredictMs(far);
  const double measured = 3 * before;
  m.Observe(shape, measured);
  // One observation moves the prediction by the refresh weight of the error.
  EXPECT_NEAR(m.PredictMs(shape),
              before + StepCostModel::kDefaultRefreshWeight * (measured - before), 1e-9 * measured);
  for (int i = 0; i < 100; ++i) m.Observe(shape, measured);
  EXPECT_NEAR(m.PredictMs(shape), measured, 1e-3 * measured);
  EXPECT_DOUBLE_EQ(m.PredictMs(far), far_before) << "cells not around the shape stay as they were";
  // Shapes beyond the grid move the cells at its edge.
  const StepShape beyond{8, 64, 4096};
  const double beyond_before = m.PredictMs(beyond);
  m.Observe(beyond, 2 * beyond_before);
  EXPECT_GT(m.PredictMs(beyond), beyond_before);
  // Nonsense times are ignored.
  const double now = m.PredictMs(shape);
  for (double bad : {0.0, -1.0, double{NAN}, double{INFINITY}}) m.Observe(shape, bad);
  EXPECT_DOUBLE_EQ(m.PredictMs(shape), now);
}

TEST(StepCostModelTest, RefusesAMalformedGrid) {
  const std::vector<double> ms = Sample(Grid());
  StepCostGrid unsorted = Grid();
  unsorted.drafted = {0, 4, 1, 16};
  EXPECT_THAT(StepCostModel::Create(unsorted, ms).status().message(), HasSubstr("drafted"));
  StepCostGrid empty = Grid();
  empty.context.clear();
  EXPECT_THAT(StepCostModel::Create(empty, {}).status().message(), HasSubstr("no context"));
  StepCostGrid zero_batch = Grid();
  zero_batch.batch = {0, 2, 8};
  EXPECT_THAT(StepCostModel::Create(zero_batch, ms).status().message(), HasSubstr("batch"));
  EXPECT_THAT(StepCostModel::Create(Grid(), {1.0, 2.0}).status().message(),
              HasSubstr("2 values for 36 points"));
  std::vector<double> negative = ms;
  negative[7] = -1;
  EXPECT_THAT(StepCostModel::Create(Grid(), negative).status().message(), HasSubstr("value 7"));
  EXPECT_FALSE(StepCostModel::Create(Grid(), ms, 0.0).ok());
  EXPECT_FALSE(StepCostModel::Create(Grid(), ms, 1.5).ok());
}

TEST(StepCostModelTest, RoundTripsThroughJsonForItsKeyOnly) {
  StepCostModel m = MakeModel();
  m.Observe({2, 3, 700}, 9.0);
  const std::string json = m.ToJson("tiny-target cuda:0 tp1");
  absl::StatusOr<StepCostModel> back = StepCostModel::FromJson(json, "tiny-target cuda:0 tp1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->grid().drafted, m.grid().drafted);
  EXPECT_EQ(back->ms(), m.ms());
  const absl::Status other = StepCostModel::FromJson(json, "8b cuda:0 tp2").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("'tiny-target cuda:0 tp1'"));
  EXPECT_THAT(other.message(), HasSubstr("'8b cuda:0 tp2'"));
  EXPECT_EQ(StepCostModel::FromJson("{\"key\": 3}", "k").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepCostModel::FromJson("not json", "k").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.Describe(), HasSubstr("batch 8, context 4096:"));
}

}  // namespace
}  // namespace treespec
