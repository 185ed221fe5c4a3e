#include "common/model/moe_router.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

// The logit whose sigmoid is p.
float Logit(float p) { return std::log(p / (1.0f - p)); }

MoeConfig Config(int experts, int groups, int topk_groups, int k) {
  MoeConfig c;
  c.num_experts = experts;
  c.num_groups = groups;
  c.topk_groups = topk_groups;
  c.experts_per_token = k;
  c.routed_scaling_factor = 1.0f;
  c.norm_topk_prob = false;
  return c;
}

std::vector<ExpertChoice> Route(const MoeConfig& c, const std::vector<float>& scores,
                                const std::vector<float>& bias) {
  std::vector<float> logits;
  for (float p : scores) logits.push_back(Logit(p));
  RouterScratch scratch;
  std::vector<ExpertChoice> out(c.experts_per_token);
  RouteRow(c, logits.data(), bias.data(), scratch, absl::MakeSpan(out));
  return out;
}

std::vector<int> Experts(const std::vector<ExpertChoice>& choices) {
  std::vector<int> e;
  for (const ExpertChoice& c : choices) e.push_back(c.expert);
  return e;
}

TEST(MoeRouterTest, TopKByBiasedScoreWeightsByUnbiasedScore) {
  const MoeConfig c = Config(4, 1, 1, 2);
  // Expert 3 has the best score but a bias that drops it below experts 0 and 2.
  const auto out = Route(c, {0.6f, 0.1f, 0.5f, 0.9f}, {0.0f, 0.0f, 0.0f, -0.5f});
  EXPECT_EQ(Experts(out), (std::vector<int>{0, 2}));  // in increasing expert order
  EXPECT_NEAR(out[0].weight, 0.6f, 1e-6);             // the unbiased score
  EXPECT_NEAR(out[1].weight, 0.5f, 1e-6);
}

TEST(MoeRouterTest, NormalizedAndScaled) {
  MoeConfig c = Config(4, 1, 1, 2);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  const auto out = Route(c, {0.6f, 0.1f, 0.2f, 0.9f}, {0, 0, 0, 0});
  EXPECT_EQ(Experts(out), (std::vector<int>{0, 3}));
  EXPECT_NEAR(out[0].weight, 0.6f / 1.5f * 2.5f, 1e-6);
  EXPECT_NEAR(out[1].weight, 0.9f / 1.5f * 2.5f, 1e-6);
}

TEST(MoeRouterTest, GroupsRankedByTheSumOfTheirTopTwo) {
  // Groups {0,1,2} and {3,4,5}: group 0 holds the single best expert (0.95) but its top-2 sum
  // 0.95 + 0.1 loses to group 1's 0.6 + 0.6, so only group 1's experts may be chosen.
  const MoeConfig c = Config(6, 2, 1, 2);
  const auto out = Route(c, {0.95f, 0.1f, 0.05f, 0.6f, 0.6f, 0.5f}, std::vector<float>(6, 0));
  EXPECT_EQ(Experts(out), (std::vector<int>{3, 4}));
}

TEST(MoeRouterTest, MaskedExpertsScoreZeroNotMinusInfinity) {
  // The kept group's experts have negative biased scores, so Transformers' 0.0 for the masked
  // group beats them: the masked experts (tied at 0.0, lower index first) take both slots.
  const MoeConfig c = Config(4, 2, 1, 2);
  const std::vector<float> bias = {-0.8f, -0.8f, -0.95f, -0.95f};
  // Group 0: choices -0.1, -0.2 (sum -0.3); group 1: -0.15, -0.35 (sum -0.5): group 0 is kept.
  const auto out = Route(c, {0.7f, 0.6f, 0.8f, 0.6f}, bias);
  EXPECT_EQ(Experts(out), (std::vector<int>{2, 3}));
  EXPECT_NEAR(out[0].weight, 0.8f, 1e-6);  // weights still from the unbiased scores
  EXPECT_NEAR(out[1].weight, 0.6f, 1e-6);
}

TEST(MoeRouterTest, TiesGoToTheLowerIndex) {
  const MoeConfig c = Config(6, 1, 1, 2);
  const auto out = Route(c, {0.3f, 0.5f, 0.2f, 0.5f, 0.5f, 0.1f}, std::vector<float>(6, 0));
  EXPECT_EQ(Experts(out), (std::vector<int>{1, 3}));
  // Tied groups likewise: groups {0,1} and {2,3} both sum 1.0; group 0 is kept.
  const MoeConfig g = Config(4, 2, 1, 1);
  EXPECT_EQ(Experts(Route(g, {0.5f, 0.5f, 0.6f, 0.4f}, std::vector<float>(4, 0))),
            (std::vector<int>{0}));
}

}  // namespace
}  // namespace treespec
