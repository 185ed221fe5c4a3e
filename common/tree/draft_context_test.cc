#include "common/tree/draft_context.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;

// Rows of layers `layers`, hidden 2: row r, layer l holds values 100 r + 10 l + {0, 1}.
TargetFeatures Rows(int rows, const std::vector<int>& layers) {
  TargetFeatures f;
  f.rows = rows;
  f.width = static_cast<int>(layers.size()) * 2;
  for (int r = 0; r < rows; ++r) {
    for (int l : layers) {
      f.bf16.push_back(static_cast<uint16_t>(100 * r + 10 * l));
      f.bf16.push_back(static_cast<uint16_t>(100 * r + 10 * l + 1));
    }
  }
  return f;
}

TEST(SelectLayersTest, KeepsTheWantedLayerBlocksOfEveryRow) {
  const TargetFeatures kept = SelectLayers(Rows(2, {0, 2, 3, 5}), {0, 2, 3, 5}, {2, 5}, 2);
  EXPECT_EQ(kept.rows, 2);
  EXPECT_EQ(kept.width, 4);
  EXPECT_THAT(kept.bf16, ElementsAre(20, 21, 50, 51, 120, 121, 150, 151));
  EXPECT_EQ(kept.bf16, Rows(2, {2, 5}).bf16);
}

TEST(SelectLayersTest, TheSameLayersOrNoRowsComeBackAsTheyAre) {
  EXPECT_EQ(SelectLayers(Rows(3, {1, 4}), {1, 4}, {1, 4}, 2).bf16, Rows(3, {1, 4}).bf16);
  const TargetFeatures none = SelectLayers(TargetFeatures{}, {1, 4}, {4}, 2);
  EXPECT_TRUE(none.empty());
}

TEST(LayerListsTest, IncludeAndUnion) {
  EXPECT_TRUE(LayersInclude(std::vector<int>{1, 3, 5}, std::vector<int>{1, 5}));
  EXPECT_TRUE(LayersInclude(std::vector<int>{1, 3}, std::vector<int>{}));
  EXPECT_FALSE(LayersInclude(std::vector<int>{1, 3}, std::vector<int>{2}));
  EXPECT_FALSE(LayersInclude(std::vector<int>{}, std::vector<int>{0}));
  EXPECT_THAT(LayersUnion(std::vector<int>{1, 5}, std::vector<int>{0, 1, 3}),
              ElementsAre(0, 1, 3, 5));
}

}  // namespace
}  // namespace treespec
