// Datasets: the random one's lengths stay in vLLM's range-ratio bounds and cover them, its ids
// stay in the vocabulary, a seed repeats it; JSONL prompts parse in order and repeat, and bad
// lines are refused naming the line.
#include "tools/loadgen/dataset.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(RandomDatasetTest, LengthsFollowTheRangeRatio) {
  EXPECT_EQ(RandomLengthRange(100, 0.0).min, 100);
  EXPECT_EQ(RandomLengthRange(100, 0.0).max, 100);
  EXPECT_EQ(RandomLengthRange(100, 0.25).min, 75);
  EXPECT_EQ(RandomLengthRange(100, 0.25).max, 125);
  EXPECT_EQ(RandomLengthRange(1, 0.9).min, 1) << "never below one token";

  absl::StatusOr<std::vector<Prompt>> prompts = RandomDataset({.num_prompts = 2000,
                                                               .input_len = 40,
                                                               .output_len = 10,
                                                               .range_ratio = 0.5,
                                                               .vocab_size = 17,
                                                               .seed = 3});
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 2000u);
  std::set<int> input_lens, output_lens, ids;
  for (const Prompt& p : *prompts) {
    EXPECT_TRUE(p.text.empty());
    input_lens.insert(static_cast<int>(p.token_ids.size()));
    output_lens.insert(p.output_len);
    ids.insert(p.token_ids.begin(), p.token_ids.end());
  }
  // Every length of [20, 60] and [5, 15] is drawn (2000 draws over 41 and 11 values).
  EXPECT_EQ(*input_lens.begin(), 20);
  EXPECT_EQ(*input_lens.rbegin(), 60);
  EXPECT_EQ(input_lens.size(), 41u);
  EXPECT_EQ(*output_lens.begin(), 5);
  EXPECT_EQ(*output_lens.rbegin(), 15);
  EXPECT_EQ(output_lens.size(), 11u);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), 16);
  EXPECT_EQ(ids.size(), 17u);
}

TEST(RandomDatasetTest, SameSeedSamePrompts) {
  const RandomDatasetOptions options = {
      .num_prompts = 5, .input_len = 8, .output_len = 4, .range_ratio = 0.5, .vocab_size = 1000};
  RandomDatasetOptions other = options;
  other.seed = 1;
  const std::vector<Prompt> a = *RandomDataset(options), b = *RandomDataset(options),
                            c = *RandomDataset(other);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].token_ids, b[i].token_ids);
    EXPECT_EQ(a[i].output_len, b[i].output_len);
  }
  EXPECT_NE(a[0].token_ids, c[0].token_ids);
}

TEST(RandomDatasetTest, RefusesBadOptions) {
  const RandomDatasetOptions good = {
      .num_prompts = 1, .input_len = 8, .output_len = 4, .vocab_size = 10};
  EXPECT_TRUE(RandomDataset(good).ok());
  RandomDatasetOptions o = good;
  o.num_prompts = 0;
  EXPECT_THAT(RandomDataset(o).status().message(), HasSubstr("number of prompts 0"));
  o = good;
  o.input_len = 0;
  EXPECT_THAT(RandomDataset(o).status().message(), HasSubstr("input length 0"));
  o = good;
  o.range_ratio = 1.0;
  EXPECT_THAT(RandomDataset(o).status().message(), HasSubstr("range ratio 1"));
  o = good;
  o.vocab_size = 0;
  EXPECT_THAT(RandomDataset(o).status().message(), HasSubstr("vocab size 0"));
}

TEST(JsonlDatasetTest, ParsesTextLinesInOrder) {
  const std::string contents =
      "{\"text\": \"def f():\\n\", \"source\": \"a.py\"}\n"
      "\n"
      "  {\"text\": \"class A:\"}  \n";
  absl::StatusOr<std::vector<Prompt>> prompts = ParseJsonlPrompts(contents, "x.jsonl", 7);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 2u);
  EXPECT_EQ((*prompts)[0].text, "def f():\n");
  EXPECT_EQ((*prompts)[1].text, "class A:");
  EXPECT_TRUE((*prompts)[0].token_ids.empty());
  EXPECT_EQ((*prompts)[1].output_len, 7);
}

TEST(JsonlDatasetTest, RefusesBadLinesNamingThem) {
  EXPECT_THAT(ParseJsonlPrompts("{\"text\": \"a\"}\nnot json\n", "p.jsonl", 1).status().message(),
              HasSubstr("p.jsonl:2: not a JSON object"));
  EXPECT_THAT(ParseJsonlPrompts("[1, 2]\n", "p.jsonl", 1).status().message(),
              HasSubstr("p.jsonl:1: not a JSON object"));
  EXPECT_THAT(ParseJsonlPrompts("{\"prompt\": \"a\"}\n", "p.jsonl", 1).status().message(),
              HasSubstr("p.jsonl:1: expected a non-empty \"text\" string"));
  EXPECT_THAT(ParseJsonlPrompts("{\"text\": 3}\n", "p.jsonl", 1).status().message(),
              HasSubstr("p.jsonl:1"));
  EXPECT_THAT(ParseJsonlPrompts("\n\n", "p.jsonl", 1).status().message(), HasSubstr("no prompts"));
  EXPECT_THAT(ParseJsonlPrompts("{\"text\": \"a\"}", "p.jsonl", 0).status().message(),
              HasSubstr("output length 0"));
}

TEST(JsonlDatasetTest, LoadsTheRepositoryPromptsAndRepeatsThem) {
  const std::string path = std::string(TREESPEC_SOURCE_DIR) + "/tests/data/heldout_prompts.jsonl";
  std::ifstream in(path);
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  absl::StatusOr<std::vector<Prompt>> file = ParseJsonlPrompts(contents, path, 16);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_GT(file->size(), 1u);
  const int count = 2 * static_cast<int>(file->size()) + 3;
  absl::StatusOr<std::vector<Prompt>> prompts = LoadJsonlDataset(path, count, 16);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), static_cast<size_t>(count));
  for (size_t i = 0; i < prompts->size(); ++i) {
    EXPECT_EQ((*prompts)[i].text, (*file)[i % file->size()].text) << i;
  }
  EXPECT_EQ(LoadJsonlDataset("/nonexistent/p.jsonl", 1, 1).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace treespec::loadgen
