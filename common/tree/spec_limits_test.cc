#include "common/tree/spec_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace treespec {
namespace {

using ::testing::HasSubstr;

SpecBounds Bounds(SpecLimits defaults, SpecLimits max) { return SpecBounds{defaults, max}; }

TEST(SpecLimitsTest, UnsetFieldsTakeTheDefaultsClampedToTheMaxima) {
  const SpecBounds bounds = Bounds({16, 8, 0}, {32, 64, 32});
  absl::StatusOr<SpecLimits> r = ResolveSpecLimits({}, bounds, "x.");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (SpecLimits{16, 8, 0}));
  // A default above a (smaller, learnt) maximum is served at the maximum, not refused.
  r = ResolveSpecLimits({0, 3, 0}, Bounds({16, 8, 0}, {4, 64, 4}), "x.");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (SpecLimits{4, 3, 0}));
}

TEST(SpecLimitsTest, SetFieldsOutsideTheBoundsNameTheFieldTheLimitAndItsSource) {
  const SpecBounds bounds = Bounds({16, 8, 0}, {32, 20, 32});
  SpecLimitSources sources;
  sources.tree_budget = "the drafters' --max_tree_budget";
  absl::StatusOr<SpecLimits> r = ResolveSpecLimits({33, 0, 0}, bounds, "speculation.", sources);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("speculation.tree_budget must be in [1, 32]"));
  EXPECT_THAT(r.status().message(), HasSubstr("32 is the drafters' --max_tree_budget"));
  r = ResolveSpecLimits({-1, 0, 0}, bounds, "speculation.");
  EXPECT_THAT(r.status().message(),
              HasSubstr("speculation.tree_budget must be in [1, 32] (got -1)"));
  r = ResolveSpecLimits({0, 21, 0}, bounds, "open.");
  EXPECT_THAT(r.status().message(), HasSubstr("open.max_depth must be in [1, 20] (got 21)"));
  r = ResolveSpecLimits({0, 0, 40}, bounds, "");
  EXPECT_THAT(r.status().message(), HasSubstr("top_k must be in [1, 32] (got 40)"));
  r = ResolveSpecLimits({32, 20, 32}, bounds, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (SpecLimits{32, 20, 32}));
}

TEST(SpecLimitsTest, BoundsAreCheckedAgainstTheCeilingWithTheFlagsNamed) {
  EXPECT_TRUE(ValidateSpecBounds(SpecBounds{}).ok());
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 8, 0}, {0, 64, 16})).message(),
              HasSubstr("--max_tree_budget must be in [1, 1024] (got 0)"));
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 8, 0}, {2000, 64, 16})).message(),
              HasSubstr("--max_tree_budget"));
  EXPECT_THAT(ValidateSpecBounds(Bounds({300, 8, 0}, {256, 64, 256})).message(),
              HasSubstr("--tree_budget must be in [1, 256] (got 300)"));
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 0, 0}, {256, 64, 256})).message(),
              HasSubstr("--max_depth must be in [1, 64] (got 0)"));
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 8, 0}, {256, 65, 256})).message(),
              HasSubstr("max_depth_limit"));
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 8, 300}, {256, 64, 256})).message(),
              HasSubstr("--top_k must be in [0, 256] (got 300)"));
  SpecFlagNames names;
  names.max_depth_limit = "options.max_depth_limit";
  EXPECT_THAT(ValidateSpecBounds(Bounds({16, 8, 0}, {256, 0, 256}), names).message(),
              HasSubstr("options.max_depth_limit"));
}

TEST(SpecLimitsTest, ClampKeepsUnsetFieldsAndMaxCombinesPools) {
  EXPECT_EQ(ClampSpecLimits({40, 0, 9}, {32, 64, 8}), (SpecLimits{32, 0, 8}));
  EXPECT_EQ(ClampSpecLimits({4, 2, 0}, {32, 64, 8}), (SpecLimits{4, 2, 0}));
  EXPECT_EQ(MaxSpecLimits({8, 64, 8}, {32, 16, 4}), (SpecLimits{32, 64, 8}));
  EXPECT_EQ(SpecLimitsString({16, 8, 0}), "tree_budget 16, max_depth 8, top_k unset");
}

}  // namespace
}  // namespace treespec
