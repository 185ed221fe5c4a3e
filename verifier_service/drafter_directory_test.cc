// The verifier's view of its drafter pool: news detection and the pool's union, including
// what feature kinds need (DrafterInfo.feature_needs, through FromProto).
#include "verifier_service/drafter_directory.h"

#include "gtest/gtest.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {
namespace {

v1::DrafterInfo Info(const std::string& id, std::vector<int> layers) {
  v1::DrafterInfo info;
  info.set_drafter_id(id);
  info.mutable_max()->set_tree_budget(64);
  info.mutable_max()->set_max_depth(16);
  info.mutable_max()->set_top_k(64);
  info.add_modes(v1::SPECULATION_MODE_NGRAM);
  info.add_modes(v1::SPECULATION_MODE_DFLASH);
  v1::FeatureNeeds* needs = info.add_feature_needs();
  needs->set_mode(v1::SPECULATION_MODE_DFLASH);
  needs->mutable_target_layers()->Assign(layers.begin(), layers.end());
  needs->set_target_hidden_size(256);
  needs->set_target_num_layers(6);
  needs->set_target_vocab_size(4096);
  v1::FeatureNeeds* unknown = info.add_feature_needs();  // a kind this build does not know
  unknown->set_mode(static_cast<v1::SpeculationMode>(99));
  return info;
}

TEST(DrafterDirectoryTest, FeatureNeedsAreNewsAndThePoolKeepsEachDistinctOne) {
  DrafterDirectory directory(absl::Seconds(60));
  const absl::Time now = absl::Now();
  const DrafterDescription a = FromProto(Info("a", {1, 3}));
  ASSERT_EQ(a.feature_needs.size(), 1u);  // the unknown kind is left out
  EXPECT_EQ(a.feature_needs[0].first, DrafterKind::kDflash);
  EXPECT_EQ(a.feature_needs[0].second, (FeatureSpec{{1, 3}, 256, 6, 4096}));
  EXPECT_TRUE(directory.Heard(a, now));
  EXPECT_FALSE(directory.Heard(a, now));
  EXPECT_TRUE(directory.Heard(FromProto(Info("a", {1, 4})), now));  // its needs changed
  EXPECT_TRUE(directory.Heard(FromProto(Info("b", {1, 3})), now));
  EXPECT_TRUE(directory.Heard(FromProto(Info("c", {1, 3})), now));
  const DrafterPoolInfo pool = directory.Pool(now);
  EXPECT_EQ(pool.drafters, 3);
  ASSERT_EQ(pool.feature_needs.size(), 2u);  // [1, 4] from a; [1, 3] from b and c, once
  EXPECT_EQ(pool.kinds, (std::vector<DrafterKind>{DrafterKind::kNgram, DrafterKind::kDflash}));
}

// AUTO resolves at the verifier only to a default every drafter heard from states.
TEST(DrafterDirectoryTest, ThePoolHasADefaultKindOnlyWhenAllItsDraftersAgree) {
  DrafterDirectory directory(absl::Seconds(60));
  const absl::Time now = absl::Now();
  v1::DrafterInfo a = Info("a", {1, 3});
  a.set_default_mode(v1::SPECULATION_MODE_DFLASH);
  EXPECT_EQ(FromProto(a).default_kind, DrafterKind::kDflash);
  EXPECT_TRUE(directory.Heard(FromProto(a), now));
  v1::DrafterInfo b = Info("b", {1, 3});
  b.set_default_mode(v1::SPECULATION_MODE_DFLASH);
  EXPECT_TRUE(directory.Heard(FromProto(b), now));
  EXPECT_EQ(directory.Pool(now).default_kind, DrafterKind::kDflash);
  b.set_default_mode(v1::SPECULATION_MODE_NGRAM);
  EXPECT_TRUE(directory.Heard(FromProto(b), now));  // its default changed: news
  EXPECT_EQ(directory.Pool(now).default_kind, std::nullopt);
  b.set_default_mode(v1::SPECULATION_MODE_AUTO);  // not a kind: states no default
  EXPECT_EQ(FromProto(b).default_kind, std::nullopt);
  // Once b has left the pool (past the ttl), a's default is the pool's.
  EXPECT_EQ(directory.Pool(now).drafters, 2);
  EXPECT_FALSE(directory.Heard(FromProto(a), now + absl::Seconds(50)));  // heard again: no news
  EXPECT_EQ(directory.Pool(now + absl::Seconds(61)).drafters, 1);
  EXPECT_EQ(directory.Pool(now + absl::Seconds(61)).default_kind, DrafterKind::kDflash);
}

}  // namespace
}  // namespace treespec
