#include "common/rpc/drafter_kind_proto.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(DrafterKindTest, EveryKindHasOneNameAndOneModeBothWays) {
  std::set<std::string> names;
  std::set<int> modes;
  for (const DrafterKindInfo& info : AllDrafterKinds()) {
    EXPECT_EQ(&InfoOf(info.kind), &info);
    EXPECT_EQ(DrafterKindFromName(info.name), info.kind);
    EXPECT_EQ(DrafterKindFromProto(ToProto(info.kind)), info.kind);
    EXPECT_EQ(v1::SpeculationMode_Name(ToProto(info.kind)),
              std::string("SPECULATION_MODE_") + info.mode_name);
    names.insert(info.name);
    modes.insert(ToProto(info.kind));
  }
  EXPECT_EQ(names.size(), AllDrafterKinds().size());
  EXPECT_EQ(modes.size(), AllDrafterKinds().size());
}

TEST(DrafterKindTest, AutoOffAndUnknownValuesNameNoKind) {
  EXPECT_EQ(DrafterKindFromProto(v1::SPECULATION_MODE_AUTO), std::nullopt);
  EXPECT_EQ(DrafterKindFromProto(v1::SPECULATION_MODE_OFF), std::nullopt);
  EXPECT_EQ(DrafterKindFromProto(42), std::nullopt);
  EXPECT_EQ(DrafterKindFromName("auto"), std::nullopt);
  EXPECT_EQ(DrafterKindFromName("NGRAM"), std::nullopt);
}

TEST(DrafterKindTest, ListsNameTheKindsInTheGivenOrder) {
  EXPECT_EQ(DrafterKindNames({DrafterKind::kNgram, DrafterKind::kDraftModel}),
            "ngram, draft_model");
  EXPECT_EQ(DrafterModeNames({DrafterKind::kDflash}), "DFLASH");
  EXPECT_EQ(DrafterModeNames({}), "");
}

}  // namespace
}  // namespace treespec
