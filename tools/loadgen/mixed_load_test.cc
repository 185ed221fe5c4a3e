// The mixed workload: streams are replaced while prompts remain to be sent, and the two groups
// are summarized apart (the streams' worst gap against their median, the prompts' prefill rate).
#include "tools/loadgen/mixed_load.h"

#include <vector>

#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

MixedLoadOptions Options() {
  return {
      .streams = 2, .stream_input_len = 12, .stream_output_len = 30, .vocab_size = 50, .seed = 4};
}

TEST(MixedLoadTest, StreamsAreSeededAndReplacedOnlyWhilePromptsRemain) {
  const Prompt a = StreamPrompt(Options(), 0), b = StreamPrompt(Options(), 1);
  EXPECT_EQ(a.group, kStreamGroup);
  EXPECT_EQ(a.token_ids.size(), 12u);
  EXPECT_EQ(a.output_len, 30);
  EXPECT_NE(a.token_ids, b.token_ids);
  EXPECT_EQ(StreamPrompt(Options(), 1).token_ids, b.token_ids);
  ASSERT_TRUE(NextStream(Options(), a, /*sent_all=*/false, 5).has_value());
  EXPECT_EQ(NextStream(Options(), a, false, 5)->token_ids, StreamPrompt(Options(), 5).token_ids);
  EXPECT_FALSE(NextStream(Options(), a, /*sent_all=*/true, 5).has_value());
  Prompt long_prompt;
  long_prompt.group = kLongPromptGroup;
  EXPECT_FALSE(NextStream(Options(), long_prompt, false, 5).has_value());
}

TEST(MixedLoadTest, TheGroupsAreSummarizedApart) {
  std::vector<Prompt> prompts = {StreamPrompt(Options(), 0), StreamPrompt(Options(), 1), {}};
  prompts[2].group = kLongPromptGroup;
  std::vector<RequestResult> requests(3);
  for (int i = 0; i < 3; ++i) {
    requests[i].index = i;
    requests[i].record.ok = true;
  }
  requests[0].record.itl_ms = {1, 1, 1, 9};
  requests[1].record.itl_ms = {1, 1, 2};
  requests[2].record.input_tokens = 3000;
  requests[2].record.cached_tokens = 1000;
  requests[2].record.ttft_ms = 500;
  requests[2].record.itl_ms = {50};
  const nlohmann::json groups = SummarizeMixed(prompts, requests, 2.0, std::vector<double>{99});
  const nlohmann::json& streams = groups[kStreamGroup];
  EXPECT_EQ(streams["completed"], 2);
  EXPECT_DOUBLE_EQ(streams["median_itl_ms"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(streams["max_itl_ms"].get<double>(), 9);  // the long prompt's 50 is not theirs
  EXPECT_DOUBLE_EQ(streams["itl_max_over_median"].get<double>(), 9);
  const nlohmann::json& long_prompts = groups[kLongPromptGroup];
  EXPECT_EQ(long_prompts["completed"], 1);
  EXPECT_DOUBLE_EQ(long_prompts["prefill_tokens_per_s"].get<double>(), 2000 / 0.5);
}

}  // namespace
}  // namespace treespec::loadgen
