// The conversation workload: each turn resends the previous prompt and answer and adds new
// tokens; turns are seeded per conversation and turn; the per-turn summary counts what the
// earlier turns made reusable.
#include "tools/loadgen/conversation.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::ElementsAreArray;

ConversationOptions Options() {
  return {.conversations = 3,
          .turns = 4,
          .history_len = 50,
          .turn_input_len = 7,
          .output_len = 5,
          .think_time_s = 0,
          .vocab_size = 100,
          .seed = 9};
}

RequestResult Answered(int index, std::vector<int32_t> answer) {
  RequestResult r;
  r.index = index;
  r.record.ok = true;
  r.record.output_tokens = static_cast<int>(answer.size());
  r.record.output_ids = std::move(answer);
  return r;
}

TEST(ConversationTest, FirstTurnsAreDistinctSeededHistories) {
  const std::vector<Prompt> first = FirstTurns(Options());
  ASSERT_EQ(first.size(), 3u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(first[c].conversation, c);
    EXPECT_EQ(first[c].turn, 1);
    EXPECT_EQ(first[c].reusable_tokens, 0);
    EXPECT_EQ(first[c].output_len, 5);
    ASSERT_EQ(first[c].token_ids.size(), 50u);
    for (int32_t t : first[c].token_ids) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 100);
    }
  }
  EXPECT_NE(first[0].token_ids, first[1].token_ids);
  EXPECT_EQ(FirstTurns(Options())[2].token_ids, first[2].token_ids);  // seeded
  ConversationOptions other = Options();
  other.seed = 10;
  EXPECT_NE(FirstTurns(other)[0].token_ids, first[0].token_ids);
}

TEST(ConversationTest, ATurnResendsThePromptAndAnswerThenAddsNewTokens) {
  const ConversationOptions o = Options();
  const Prompt first = FirstTurns(o)[1];
  const std::vector<int32_t> answer = {1, 2, 3, 4, 5};
  const std::optional<Prompt> second = NextTurn(o, first, Answered(1, answer));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->conversation, 1);
  EXPECT_EQ(second->turn, 2);
  ASSERT_EQ(second->token_ids.size(), 50u + 5 + 7);
  std::vector<int32_t> head = first.token_ids;
  head.insert(head.end(), answer.begin(), answer.end());
  EXPECT_THAT(std::vector<int32_t>(second->token_ids.begin(), second->token_ids.begin() + 55),
              ElementsAreArray(head));
  // The answer's last token's K/V was never computed: all but it are reusable.
  EXPECT_EQ(second->reusable_tokens, 54);
  // The new tokens depend on the conversation and the turn only.
  EXPECT_EQ(NextTurn(o, first, Answered(1, answer))->token_ids, second->token_ids);

  // The last turn leads nowhere; nor does a turn that failed.
  Prompt last = *second;
  last.turn = o.turns;
  EXPECT_FALSE(NextTurn(o, last, Answered(1, answer)).has_value());
  RequestResult failed = Answered(1, answer);
  failed.record.ok = false;
  EXPECT_FALSE(NextTurn(o, first, failed).has_value());
  EXPECT_EQ(LastTurnTokens(o), 50 + 3 * (5 + 7) + 5);
}

TEST(ConversationTest, TheSummaryReportsEachTurnsReuseOfWhatCameBefore) {
  const ConversationOptions o = Options();
  std::vector<Prompt> prompts = FirstTurns(o);
  std::vector<RequestResult> requests;
  for (int c = 0; c < 2; ++c) {
    RequestResult r = Answered(c, {1, 2, 3, 4, 5});
    r.record.input_tokens = 50;
    r.record.ttft_ms = 100 + c;
    requests.push_back(r);
    Prompt next = *NextTurn(o, prompts[c], r);
    const int index = static_cast<int>(prompts.size());
    prompts.push_back(next);
    RequestResult second = Answered(index, {6, 7, 8, 9, 10});
    second.record.input_tokens = 62;
    second.record.cached_tokens = 48;  // 3 pages of 16 of the 54 reusable
    second.record.ttft_ms = 10 + c;
    requests.push_back(second);
  }
  RequestResult failed;  // leaves no mark
  failed.index = 2;
  requests.push_back(failed);
  const nlohmann::json turns = SummarizeTurns(prompts, requests, std::vector<double>{99});
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0]["turn"], 1);
  EXPECT_EQ(turns[0]["completed"], 2);
  EXPECT_DOUBLE_EQ(turns[0]["mean_ttft_ms"].get<double>(), 100.5);
  EXPECT_TRUE(turns[0]["reused_share"].is_null());
  EXPECT_EQ(turns[1]["turn"], 2);
  EXPECT_EQ(turns[1]["total_input_tokens"], 124);
  EXPECT_EQ(turns[1]["total_cached_tokens"], 96);
  EXPECT_EQ(turns[1]["reusable_tokens"], 108);
  EXPECT_DOUBLE_EQ(turns[1]["reused_share"].get<double>(), 96.0 / 108);
  EXPECT_DOUBLE_EQ(turns[1]["max_ttft_ms"].get<double>(), 11);
  EXPECT_TRUE(turns[1].contains("p99_ttft_ms"));
}

}  // namespace
}  // namespace treespec::loadgen
