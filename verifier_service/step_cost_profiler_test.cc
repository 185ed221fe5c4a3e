#include "verifier_service/step_cost_profiler.h"

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/model/forwarding_causal_lm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What the fake clock charges a verify step, in ms: linear in the rows and in the context read.
double FakeCost(int batch, int rows, int64_t context) {
  return 0.5 + 0.1 * batch + 0.02 * rows + 0.0005 * context;
}

// The CPU model with a fake clock: each VerifyStep advances it by `cost` (FakeCost unless
// given) of its batch.
class ClockedLm final : public ForwardingCausalLm {
 public:
  using CostFn = std::function<double(int batch, int rows, int64_t context)>;
  explicit ClockedLm(std::unique_ptr<CausalLm> lm, CostFn cost = FakeCost)
      : ForwardingCausalLm(std::move(lm)), cost_(std::move(cost)) {}
  absl::StatusOr<std::vector<StepResult>> VerifyStep(absl::Span<const SeqTree> batch,
                                                     absl::Span<const StepSpec> specs) override {
    int rows = 0;
    int64_t context = 0;
    for (const SeqTree& t : batch) {
      rows += static_cast<int>(t.tokens.size());
      context += t.committed_len;
    }
    now_ += absl::Milliseconds(cost_(static_cast<int>(batch.size()), rows, context));
    ++steps_;
    max_rows_ = std::max(max_rows_, rows);
    return ForwardingCausalLm::VerifyStep(batch, specs);
  }

  CostFn cost_;
  absl::Time now_ = absl::UnixEpoch();
  int steps_ = 0;
  int max_rows_ = 0;  // of the largest step run
};

std::unique_ptr<CausalLm> SmallCpuLm(int max_batch) {
  const ModelConfig config = testing::SmallLlamaConfig();
  LmOptions options;
  options.max_batch = max_batch;
  auto lm = CreateCpuCausalLm(config, testing::RandomWeights(config, 3), options);
  EXPECT_TRUE(lm.ok()) << lm.status();
  return *std::move(lm);
}

// Profile options on `lm`'s fake clock.
StepCostProfileOptions ClockedOptions(ClockedLm& lm, int max_batch, int max_tree_nodes, int reps) {
  StepCostProfileOptions o;
  o.max_batch = max_batch;
  o.max_tree_nodes = max_tree_nodes;
  o.reps = reps;
  o.now = [&lm] { return lm.now_; };
  return o;
}

TEST(StepCostProfilerTest, PlansAGridThatFitsTheModel) {
  StepCostProfileOptions o;
  o.max_batch = 12;
  o.max_tree_nodes = 64;
  o.max_context = 8192;
  StepCostGrid g = PlanStepCostGrid(o, 32768, 12 * 1024, 16);
  EXPECT_THAT(g.batch, ElementsAre(1, 2, 4, 8, 12));
  EXPECT_THAT(g.drafted, ElementsAre(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64));
  EXPECT_THAT(g.context, ElementsAre(64, 1024, 8192));
  // The context length, then the KV cache, bound the context.
  EXPECT_THAT(PlanStepCostGrid(o, 1000, 12 * 1024, 16).context, ElementsAre(64, 116, 935));
  EXPECT_THAT(PlanStepCostGrid(o, 32768, 12 * 100, 16).context, ElementsAre(64, 191, 1535));
  EXPECT_THAT(PlanStepCostGrid(o, 40, 12 * 100, 16).context, ElementsAre(0));
  o.max_tree_nodes = 5;
  EXPECT_THAT(PlanStepCostGrid(o, 32768, 12 * 1024, 16).drafted, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(StepCostProfilerTest, MeasuresEveryPointOnTheClockAndExtendsTheLargestSteps) {
  ClockedLm lm(SmallCpuLm(4));
  const int free_pages = lm.kv_cache().free_pages();
  StepCostProfileOptions o = ClockedOptions(lm, 4, 24, 2);
  o.max_step_rows = 40;
  absl::StatusOr<StepCostModel> model = ProfileStepCost(lm, o);
  ASSERT_TRUE(model.ok()) << model.status();
  const StepCostGrid& g = model->grid();
  EXPECT_THAT(g.batch, ElementsAre(1, 2, 4));
  EXPECT_THAT(g.context, ElementsAre(64, 231)) << "256 positions less the largest tree";
  int timed = 0;
  for (size_t b = 0; b < g.batch.size(); ++b) {
    for (size_t d = 0; d < g.drafted.size(); ++d) {
      for (size_t c = 0; c < g.context.size(); ++c) {
        const int batch = g.batch[b], rows = batch * (g.drafted[d] + 1);
        if (rows <= o.max_step_rows) ++timed;
        // FakeCost is linear in the rows, so the extended points are exact too.
        EXPECT_NEAR(model->ms()[g.Index(b, d, c)],
                    FakeCost(batch, rows, static_cast<int64_t>(batch) * g.context[c]), 1e-9)
            << "batch " << batch << ", drafted " << g.drafted[d] << ", context " << g.context[c];
      }
    }
  }
  EXPECT_LT(timed, static_cast<int>(g.size())) << "some points must lie above max_step_rows";
  EXPECT_EQ(lm.steps_, timed * (o.reps + 1));
  EXPECT_EQ(lm.kv_cache().free_pages(), free_pages) << "the profile gives back every page";
}

TEST(StepCostProfilerTest, StopsEachPairAtItsShareOfTheTimeBudget) {
  ClockedLm lm(SmallCpuLm(2));
  StepCostProfileOptions o = ClockedOptions(lm, 2, 16, 1);
  o.max_seconds = 1e-6;  // less than any step: two points per (batch, context) pair
  absl::StatusOr<StepCostModel> model = ProfileStepCost(lm, o);
  ASSERT_TRUE(model.ok()) << model.status();
  const StepCostGrid& g = model->grid();
  EXPECT_EQ(lm.steps_, static_cast<int>(g.batch.size() * g.context.size()) * 2 * (o.reps + 1));
  for (size_t b = 0; b < g.batch.size(); ++b) {
    for (size_t c = 0; c < g.context.size(); ++c) {
      const int batch = g.batch[b];
      EXPECT_NEAR(model->ms()[g.Index(b, g.drafted.size() - 1, c)],
                  FakeCost(batch, batch * (g.drafted.back() + 1), int64_t{batch} * g.context[c]),
                  1e-9);
    }
  }
}

// A GPU step costs the same while its GEMMs stream the weights, then grows with the rows. With
// time for only a few points per pair, the profile still times the largest tree that fits and
// finds the bend between, instead of extending the flat start.
TEST(StepCostProfilerTest, APairCutShortStillSpansItsTrees) {
  auto bent = [](int, int rows, int64_t) { return std::max(2.0, 0.05 * rows); };
  ClockedLm lm(SmallCpuLm(2), bent);
  StepCostProfileOptions o = ClockedOptions(lm, 2, 64, 1);
  o.max_step_rows = 130;  // every tree of either batch fits
  const StepCostGrid g = PlanStepCostGrid(o, lm.config().max_position_embeddings,
                                          lm.kv_cache().num_pages(), lm.kv_cache().page_size());
  ASSERT_THAT(g.drafted, ElementsAre(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64));
  // About eight points' time per pair (two steps each) at batch 2.
  o.max_seconds = 8 * 2 * 0.002 * static_cast<double>(g.batch.size() * g.context.size());
  absl::StatusOr<StepCostModel> model = ProfileStepCost(lm, o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_LT(lm.steps_, static_cast<int>(g.size()) * (o.reps + 1)) << "cut short";
  for (size_t b = 0; b < g.batch.size(); ++b) {
    for (size_t c = 0; c < g.context.size(); ++c) {
      double worst = 0;
      for (size_t d = 0; d < g.drafted.size(); ++d) {
        const double truth = bent(g.batch[b], g.batch[b] * (g.drafted[d] + 1), 0);
        worst = std::max(worst, std::abs(model->ms()[g.Index(b, d, c)] / truth - 1));
      }
      EXPECT_LT(worst, 0.35) << "batch " << g.batch[b];
      const size_t largest = g.Index(b, g.drafted.size() - 1, c);
      EXPECT_NEAR(model->ms()[largest], bent(g.batch[b], g.batch[b] * 65, 0), 1e-9);
    }
  }
}

// Where a step costs its rows (the CPU), the largest tree would take far longer than a pair's
// share: it is not timed once the first two points show that, and its cost is extended.
TEST(StepCostProfilerTest, APointThatWouldOverrunTheShareIsNotTimed) {
  auto rows_cost = [](int, int rows, int64_t) { return 1.0 * rows; };
  ClockedLm lm(SmallCpuLm(1), rows_cost);
  StepCostProfileOptions o = ClockedOptions(lm, 1, 64, 1);
  const StepCostGrid g = PlanStepCostGrid(o, lm.config().max_position_embeddings,
                                          lm.kv_cache().num_pages(), lm.kv_cache().page_size());
  // 20 ms a step per pair: 0 and 1 drafted nodes take 2 × (1 + 2) ms, a 65-row step 130.
  o.max_seconds = 2 * 0.010 * static_cast<double>(g.batch.size() * g.context.size());
  absl::StatusOr<StepCostModel> model = ProfileStepCost(lm, o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_LT(lm.max_rows_, 65);
  EXPECT_NEAR(model->ms()[g.Index(0, g.drafted.size() - 1, 0)], 65, 1e-9) << "extended";
}

TEST(StepCostProfilerTest, KeepsTheProfileInACacheFileForItsKeyOnly) {
  ClockedLm lm(SmallCpuLm(2));
  const StepCostProfileOptions o = ClockedOptions(lm, 2, 8, 1);
  const std::string path = ::testing::TempDir() + "/step_cost_cache_test.json";
  std::remove(path.c_str());
  bool profiled = false;
  absl::StatusOr<StepCostModel> first =
      LoadOrProfileStepCost(lm, o, path, "tiny cpu tp1", &profiled);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(profiled);
  const int steps = lm.steps_;
  absl::StatusOr<StepCostModel> again =
      LoadOrProfileStepCost(lm, o, path, "tiny cpu tp1", &profiled);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(profiled);
  EXPECT_EQ(lm.steps_, steps) << "a cached profile runs no step";
  EXPECT_EQ(again->ms(), first->ms());
  // Another key (say, another TP) profiles again and replaces the file.
  ASSERT_TRUE(LoadOrProfileStepCost(lm, o, path, "tiny cpu tp2", &profiled).ok());
  EXPECT_TRUE(profiled);
  ASSERT_TRUE(LoadOrProfileStepCost(lm, o, path, "tiny cpu tp2", &profiled).ok());
  EXPECT_FALSE(profiled);
  // A damaged file is profiled over.
  { std::ofstream(path, std::ios::trunc) << "{\"key\": \"tiny cpu tp2\", \"ms\": [1, 2"; }
  ASSERT_TRUE(LoadOrProfileStepCost(lm, o, path, "tiny cpu tp2", &profiled).ok());
  EXPECT_TRUE(profiled);
  // No cache path: always profiled.
  ASSERT_TRUE(LoadOrProfileStepCost(lm, o, "", "tiny cpu tp2", &profiled).ok());
  EXPECT_TRUE(profiled);
  const absl::Status unwritable =
      LoadOrProfileStepCost(lm, o, ::testing::TempDir() + "/no/such/dir/cost.json", "k", &profiled)
          .status();
  EXPECT_THAT(unwritable.message(), HasSubstr("/no/such/dir/cost.json"));
  std::remove(path.c_str());
}

TEST(StepCostProfilerTest, TimesTheRealCpuModel) {
  std::unique_ptr<CausalLm> lm = SmallCpuLm(2);
  StepCostProfileOptions o;
  o.max_batch = 2;
  o.max_tree_nodes = 32;
  o.reps = 1;
  absl::StatusOr<StepCostModel> model = ProfileStepCost(*lm, o);
  ASSERT_TRUE(model.ok()) << model.status();
  // The CPU forward costs about its rows: 66 rows over a long context take longer than one.
  const StepCostGrid& g = model->grid();
  EXPECT_GT(model->ms()[g.Index(g.batch.size() - 1, g.drafted.size() - 1, g.context.size() - 1)],
            model->ms()[g.Index(0, 0, 0)]);
  EXPECT_EQ(lm->kv_cache().free_pages(), lm->kv_cache().num_pages());
}

TEST(StepCostProfilerTest, RefusesOptionsItCannotProfile) {
  std::unique_ptr<CausalLm> lm = SmallCpuLm(2);
  StepCostProfileOptions o;
  o.max_batch = 8;
  o.max_step_rows = 10;
  EXPECT_THAT(ProfileStepCost(*lm, o).status().message(), HasSubstr("max_step_rows 10"));
  o.max_step_rows = 1024;
  o.reps = 0;
  EXPECT_THAT(ProfileStepCost(*lm, o).status().message(), HasSubstr("reps"));
  o.reps = 1;
  o.max_seconds = 0;
  EXPECT_THAT(ProfileStepCost(*lm, o).status().message(), HasSubstr("max_seconds"));
}

}  // namespace
}  // namespace treespec
