#include "drafter_service/replay_drafter.h"

#include <cmath>
#include <fstream>
#include <numeric>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

DraftContext Tokens(std::vector<int32_t> tokens) { return DraftContext{std::move(tokens), {}}; }

// One record: prompt 1 2 3, then 1000 tokens 100 + i % 400.
std::shared_ptr<const ReplayRecords> LongRecord() {
  std::vector<int32_t> seq = {1, 2, 3};
  for (int i = 0; i < 1000; ++i) seq.push_back(100 + i % 400);
  return std::make_shared<const ReplayRecords>(
      std::vector<std::vector<int32_t>>{{7, 7}, seq, {1, 2, 4, 9}});
}

std::unique_ptr<DraftSession> Open(const std::shared_ptr<const ReplayRecords>& records,
                                   ReplayOptions options, std::vector<int32_t> prompt) {
  ReplayDrafterFactory factory(records, options);
  auto session = factory.NewSession();
  EXPECT_TRUE(session.ok());
  EXPECT_TRUE((*session)->Append(Tokens(std::move(prompt))).ok());
  return *std::move(session);
}

TEST(ReplayRecordsTest, LoadsLoadgenRecordsAndFindsTheOneAContextStartsWith) {
  const std::string path =
      WriteFile("records.jsonl",
                "{\"prompt_ids\": [5, 6], \"output_ids\": [7, 8, 9]}\n\n"
                "{\"prompt_ids\": [5], \"output_ids\": [1], \"other\": true}\n");
  absl::StatusOr<ReplayRecords> records = ReplayRecords::Load(path);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 2);
  EXPECT_EQ(records->vocab_bound(), 10);
  const int i = records->Find(std::vector<int32_t>{5, 6, 7});
  ASSERT_GE(i, 0);
  EXPECT_THAT(records->record(i), ElementsAre(5, 6, 7, 8, 9));
  EXPECT_THAT(records->record(records->Find(std::vector<int32_t>{5, 1})), ElementsAre(5, 1));
  EXPECT_EQ(records->Find(std::vector<int32_t>{5, 6, 8}), -1);
  EXPECT_EQ(records->Find(std::vector<int32_t>{5, 6, 7, 8, 9, 10}), -1);
  EXPECT_EQ(records->Find(std::vector<int32_t>{4}), -1);
}

TEST(ReplayRecordsTest, BadFilesAreRefusedNamingTheLine) {
  EXPECT_THAT(ReplayRecords::Load("/nonexistent/records.jsonl").status().message(),
              HasSubstr("--record_tokens"));
  EXPECT_THAT(ReplayRecords::Load(WriteFile("empty.jsonl", "\n")).status().message(),
              HasSubstr("holds no record"));
  EXPECT_THAT(
      ReplayRecords::Load(WriteFile("bad1.jsonl", "{\"prompt_ids\": [1]}\n")).status().message(),
      HasSubstr("bad1.jsonl:1: \"output_ids\" is missing"));
  EXPECT_THAT(ReplayRecords::Load(WriteFile("bad2.jsonl",
                                            "{\"prompt_ids\": [1], \"output_ids\": []}\n"
                                            "{\"prompt_ids\": [-3], \"output_ids\": []}\n"))
                  .status()
                  .message(),
              HasSubstr("bad2.jsonl:2: \"prompt_ids\" holds -3"));
  EXPECT_THAT(ReplayRecords::Load(WriteFile("bad3.jsonl", "[1, 2]\n")).status().message(),
              HasSubstr("not a JSON object"));
  EXPECT_FALSE(ValidateReplayOptions({-0.1, 1, 0}).ok());
  EXPECT_FALSE(ValidateReplayOptions({0.5, 0, 0}).ok());
  EXPECT_TRUE(ValidateReplayOptions({1, 4, 0}).ok());
}

TEST(ReplayDrafterTest, WithoutReplacementsAChainIsTheRecordedContinuation) {
  auto session = Open(LongRecord(), {0.0, 1, 0}, {1, 2, 3});
  absl::StatusOr<DraftedTree> tree = session->Draft({16, 5, 0});
  ASSERT_TRUE(tree.ok());
  EXPECT_THAT(tree->tokens, ElementsAre(100, 101, 102, 103, 104));
  EXPECT_THAT(tree->parents, ElementsAre(-1, 0, 1, 2, 3));
  EXPECT_THAT(tree->logprobs, ElementsAre(0, 0, 0, 0, 0));
  // The verifier accepted two and emitted its bonus: the next tree starts after it.
  ASSERT_TRUE(session->Append(Tokens({100, 101, 102})).ok());
  tree = session->Draft({3, 8, 0});
  ASSERT_TRUE(tree.ok());
  EXPECT_THAT(tree->tokens, ElementsAre(103, 104, 105));
}

TEST(ReplayDrafterTest, AContextThatLeavesItsRecordOrMatchesNoneDraftsNothing) {
  auto session = Open(LongRecord(), {0.0, 1, 0}, {1, 2, 3});
  ASSERT_TRUE(session->Append(Tokens({100, 555})).ok());
  EXPECT_THAT(session->Draft({16, 8, 0})->tokens, IsEmpty());
  EXPECT_THAT(Open(LongRecord(), {0.0, 1, 0}, {9, 9})->Draft({16, 8, 0})->tokens, IsEmpty());
  // The end of a record bounds the depth.
  auto short_one = Open(LongRecord(), {0.0, 1, 0}, {1, 2, 4});
  EXPECT_THAT(short_one->Draft({16, 8, 0})->tokens, ElementsAre(9));
}

// Depth 1 of a chain survives with 1 - r; a tree of width k keeps the true token among the
// children of a depth with 1 - r^k, and the path goes on under it.
TEST(ReplayDrafterTest, ReplacementsHappenAtTheSetRate) {
  for (const int width : {1, 3}) {
    const double r = 0.4;
    auto session = Open(LongRecord(), {r, width, 7}, {1, 2, 3});
    int survived = 0, steps = 0;
    for (int pos = 0; pos < 900; ++pos, ++steps) {
      absl::StatusOr<DraftedTree> tree = session->Draft({4 * width, 4, 0});
      ASSERT_TRUE(tree.ok());
      ASSERT_TRUE(ValidateDraftedTree(*tree, 500, 4 * width, 4).ok());
      ASSERT_EQ(tree->tokens.size(), static_cast<size_t>(4 * width));
      const int32_t truth = 100 + pos % 400;
      bool found = false;
      for (int j = 0; j < width; ++j) {
        EXPECT_EQ(tree->parents[j], -1);
        EXPECT_NEAR(tree->logprobs[j], std::log((1 - r) * std::pow(r, j)), 1e-5);
        if (tree->tokens[j] == truth) {
          EXPECT_FALSE(found) << "the true token appears once";
          found = true;
          // The next depth hangs under the true token.
          EXPECT_EQ(tree->parents[width], j);
        }
      }
      survived += found;
      ASSERT_TRUE(session->Append(Tokens({truth})).ok());
    }
    EXPECT_NEAR(static_cast<double>(survived) / steps, 1 - std::pow(r, width), 0.05)
        << "width " << width;
  }
}

TEST(ReplayDrafterTest, ReplacementsAreAFunctionOfTheSeedAndPosition) {
  const DraftedTree a = *Open(LongRecord(), {0.5, 2, 1}, {1, 2, 3})->Draft({16, 8, 0});
  const DraftedTree b = *Open(LongRecord(), {0.5, 2, 1}, {1, 2, 3})->Draft({16, 8, 0});
  const DraftedTree c = *Open(LongRecord(), {0.5, 2, 2}, {1, 2, 3})->Draft({16, 8, 0});
  EXPECT_THAT(a.tokens, ElementsAreArray(b.tokens));
  EXPECT_NE(a.tokens, c.tokens);
  // Rate 1: every candidate is another token.
  const DraftedTree all = *Open(LongRecord(), {1.0, 1, 0}, {1, 2, 3})->Draft({8, 8, 0});
  ASSERT_EQ(all.tokens.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NE(all.tokens[i], 100 + i);
}

}  // namespace
}  // namespace treespec
