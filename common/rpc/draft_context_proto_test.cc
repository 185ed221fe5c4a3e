#include "common/rpc/draft_context_proto.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;

DraftContext TwoRows() {
  DraftContext c;
  c.tokens = {5, 6};
  c.features.rows = 2;
  c.features.width = 3;
  c.features.bf16 = {0x3f80, 0xbf80, 0x0000, 0x4049, 0x0001, 0x8000};  // 1, -1, 0, pi, tiny, -0
  return c;
}

TEST(DraftContextProtoTest, RoundTripsTokensAndFeatures) {
  const DraftContext in = TwoRows();
  v1::DraftCommit commit;
  commit.set_step(7);
  ToProto(in, &commit);
  EXPECT_EQ(commit.step(), 7);
  EXPECT_EQ(commit.feature_rows(), 2);
  ASSERT_EQ(commit.features().size(), 12u);
  EXPECT_EQ(static_cast<uint8_t>(commit.features()[0]), 0x80);  // little-endian
  EXPECT_EQ(static_cast<uint8_t>(commit.features()[1]), 0x3f);
  absl::StatusOr<DraftContext> out = DraftContextFromProto(commit, "commit step 7");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens, in.tokens);
  EXPECT_EQ(out->features.rows, 2);
  EXPECT_EQ(out->features.width, 3);
  EXPECT_EQ(out->features.bf16, in.features.bf16);
}

// A commit's rows go in parts of at most the byte limit (whole rows, at least one a part):
// every part but the last is marked `more` and has no tokens; their rows in order are the
// commit's. Rows that fit, or no rows, are one message.
TEST(DraftContextProtoTest, CommitPartsSplitRowsAndEndWithTheTokens) {
  DraftContext in;
  in.tokens = {4, 5, 6};
  in.features.rows = 10;
  in.features.width = 4;  // 8 bytes a row
  for (int i = 0; i < 40; ++i) in.features.bf16.push_back(static_cast<uint16_t>(0x3f80 + i));
  auto rows_of = [](const std::vector<v1::DraftRequest>& parts) {
    std::vector<int> rows;
    for (const v1::DraftRequest& p : parts) rows.push_back(p.commit().feature_rows());
    return rows;
  };
  for (const auto& [limit, want] : std::vector<std::pair<size_t, std::vector<int>>>{
           {24, {3, 3, 3, 1}}, {80, {10}}, {1 << 20, {10}}, {5, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}}) {
    const std::vector<v1::DraftRequest> parts = CommitParts(9, in, limit);
    EXPECT_EQ(rows_of(parts), want) << "limit " << limit;
    TargetFeatures joined;
    for (size_t i = 0; i < parts.size(); ++i) {
      const v1::DraftCommit& part = parts[i].commit();
      EXPECT_EQ(part.step(), 9);
      const bool last = i + 1 == parts.size();
      EXPECT_EQ(part.more(), !last);
      EXPECT_EQ(part.tokens_size(), last ? 3 : 0);
      absl::StatusOr<DraftContext> got = DraftContextFromProto(part, "part");
      ASSERT_TRUE(got.ok()) << got.status();
      joined.Append(got->features);
    }
    EXPECT_EQ(joined.bf16, in.features.bf16) << "limit " << limit;
  }
  in.features = TargetFeatures();
  const std::vector<v1::DraftRequest> one = CommitParts(2, in);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(one[0].commit().more());
  EXPECT_EQ(one[0].commit().tokens_size(), 3);
  EXPECT_EQ(one[0].commit().feature_rows(), 0);
}

TEST(DraftContextProtoTest, NoFeaturesIsEmpty) {
  DraftContext in;
  in.tokens = {1};
  v1::DraftCommit commit;
  ToProto(in, &commit);
  absl::StatusOr<DraftContext> out = DraftContextFromProto(commit, "commit step 0");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->features.empty());
  EXPECT_EQ(out->features.width, 0);
}

TEST(DraftContextProtoTest, RefusesPayloadsThatAreNotWholeRows) {
  v1::DraftCommit commit;
  ToProto(TwoRows(), &commit);
  v1::DraftCommit odd = commit;
  odd.mutable_features()->pop_back();  // 11 bytes
  EXPECT_THAT(DraftContextFromProto(odd, "commit step 1").status().message(),
              HasSubstr("commit step 1: features has 11 bytes for feature_rows 2"));
  v1::DraftCommit no_rows = commit;
  no_rows.set_feature_rows(0);
  EXPECT_THAT(DraftContextFromProto(no_rows, "c").status().message(),
              HasSubstr("features has 12 bytes for feature_rows 0"));
  v1::DraftCommit no_bytes = commit;
  no_bytes.clear_features();
  EXPECT_THAT(DraftContextFromProto(no_bytes, "c").status().message(),
              HasSubstr("features has 0 bytes for feature_rows 2"));
  v1::DraftCommit five = commit;
  five.set_feature_rows(5);  // 12 bytes are not 5 rows
  EXPECT_EQ(DraftContextFromProto(five, "c").status().code(), absl::StatusCode::kInvalidArgument);
  v1::DraftCommit negative = commit;
  negative.set_feature_rows(-2);
  EXPECT_THAT(DraftContextFromProto(negative, "c").status().message(),
              HasSubstr("feature_rows is -2"));
}

TEST(DraftContextProtoTest, RefusesNonFiniteValuesNamingTheirPlace) {
  DraftContext nan = TwoRows();
  nan.features.bf16[4] = 0x7fc0;  // row 1, column 1
  v1::DraftCommit commit;
  ToProto(nan, &commit);
  absl::Status s = DraftContextFromProto(commit, "commit step 2").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("commit step 2: features: row 1 column 1 is not finite (NaN)"));
  DraftContext inf = TwoRows();
  inf.features.bf16[0] = 0xff80;  // -inf
  ToProto(inf, &commit);
  EXPECT_THAT(DraftContextFromProto(commit, "c").status().message(),
              HasSubstr("row 0 column 0 is not finite (inf)"));
}

TEST(DraftContextProtoTest, FeatureNeedsRoundTrip) {
  const FeatureSpec needs{{1, 9, 17, 25, 33}, 4096, 36, 151936};
  v1::FeatureNeeds proto;
  ToProto(DrafterKind::kDflash, needs, &proto);
  EXPECT_EQ(proto.mode(), v1::SPECULATION_MODE_DFLASH);
  EXPECT_EQ(FromProto(proto), needs);
}

TEST(DraftContextTest, FeatureTargetMustMatchTheVerifiersModel) {
  const FeatureSpec needs{{1, 3}, 256, 6, 4096};
  EXPECT_TRUE(CheckFeatureTarget(needs, 256, 6, 4096, "d").ok());
  EXPECT_TRUE(CheckFeatureTarget(FeatureSpec{}, 1, 1, 1, "d").ok());
  const absl::Status wrong = CheckFeatureTarget(needs, 256, 6, 32000, "drafter x");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(), HasSubstr("drafter x was trained for a target of hidden 256, 6 "
                                         "layers, vocab 4096; this verifier serves hidden 256, "
                                         "6 layers, vocab 32000"));
  EXPECT_EQ(CheckFeatureTarget({{3, 1}, 256, 6, 4096}, 256, 6, 4096, "d").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckFeatureTarget({{1, 6}, 256, 6, 4096}, 256, 6, 4096, "d").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DraftContextTest, FeaturesAppendRowsAndSpecsPrint) {
  TargetFeatures all;
  all.Append(TwoRows().features);
  all.Append(TargetFeatures{});
  all.Append(TwoRows().features);
  EXPECT_EQ(all.rows, 4);
  EXPECT_EQ(all.width, 3);
  EXPECT_EQ(all.bf16.size(), 12u);
  EXPECT_TRUE(CheckTargetFeatures(all, "all").ok());
  EXPECT_EQ(FeatureSpecString(FeatureSpec{}), "none");
  EXPECT_EQ(FeatureSpecString(FeatureSpec{{1, 3}, 256, 6, 4096}), "layers [1, 3] x hidden 256");
  EXPECT_EQ((FeatureSpec{{1, 3}, 256, 6, 4096}).width(), 512);
}

}  // namespace
}  // namespace treespec
