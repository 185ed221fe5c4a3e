#include "verifier_service/output_processor.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;

GenerationRequest Req(int max_new) {
  GenerationRequest r;
  r.max_new_tokens = max_new;
  r.return_text = true;
  return r;
}

TEST(OutputProcessorTest, StopsAtMaxTokensAndDropsTheRest) {
  GenerationRequest r = Req(3);
  OutputProcessor out(r, nullptr, {2});
  GenerationUpdate u = out.Append({10, 11});
  EXPECT_FALSE(u.finished);
  u = out.Append({12, 13, 14});
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, FinishReason::kLength);
  EXPECT_THAT(u.token_ids, ElementsAre(12));
  EXPECT_EQ(out.completion_tokens(), 3);
}

TEST(OutputProcessorTest, EosAndStopIds) {
  GenerationRequest r = Req(10);
  r.stop_token_ids = {7};
  OutputProcessor a(r, nullptr, {2});
  GenerationUpdate u = a.Append({5, 2, 6});
  EXPECT_EQ(u.finish_reason, FinishReason::kEos);
  EXPECT_THAT(u.token_ids, ElementsAre(5, 2));
  OutputProcessor b(r, nullptr, {2});
  u = b.Append({5, 7, 6});
  EXPECT_EQ(u.finish_reason, FinishReason::kStopToken);
  EXPECT_THAT(u.token_ids, ElementsAre(5, 7));
  r.ignore_eos = true;
  OutputProcessor c(r, nullptr, {2});
  u = c.Append({5, 2, 6});
  EXPECT_FALSE(u.finished);
  EXPECT_THAT(u.token_ids, ElementsAre(5, 2, 6));
}

class OutputProcessorTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok =
        LoadTokenizer(std::string(TREESPEC_SOURCE_DIR) + "/models/tiny-target/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }
  std::vector<int32_t> Encode(const std::string& s) { return *tokenizer_->Encode(s); }
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Fed one token at a time, deltas never split a character and add up to the whole text.
TEST_F(OutputProcessorTextTest, DeltasAreWholeCharacters) {
  const std::string text = "def f():\n    return \"héllo wörld ✓ 日本語 🎉\"\n";
  const std::vector<int32_t> ids = Encode(text);
  GenerationRequest r = Req(1000);
  OutputProcessor out(r, tokenizer_.get(), {});
  std::string joined;
  for (int32_t id : ids) {
    GenerationUpdate u = out.Append({id});
    // Each delta is valid UTF-8 on its own: no dangling lead or continuation bytes.
    int pending = 0;
    for (unsigned char c : u.text) {
      if (pending > 0) {
        ASSERT_EQ(c & 0xC0, 0x80);
        --pending;
      } else if (c >= 0xF0)
        pending = 3;
      else if (c >= 0xE0)
        pending = 2;
      else if (c >= 0xC0)
        pending = 1;
    }
    EXPECT_EQ(pending, 0) << "delta '" << u.text << "' splits a character";
    joined += u.text;
  }
  joined += out.Finish(FinishReason::kLength).text;
  EXPECT_EQ(joined, text);
}

// Stop strings end the output before the stop string, even when it spans tokens, and no text
// past it is ever streamed.
TEST_F(OutputProcessorTextTest, StopStringAcrossTokens) {
  const std::string text = "x = 1\nprint(x)\n# END here\nmore";
  const std::vector<int32_t> ids = Encode(text);
  GenerationRequest r = Req(1000);
  r.stop_strings = {"# END"};
  OutputProcessor out(r, tokenizer_.get(), {});
  std::string joined;
  GenerationUpdate u;
  for (int32_t id : ids) {
    u = out.Append({id});
    joined += u.text;
    if (u.finished) break;
  }
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(joined, "x = 1\nprint(x)\n");
}

}  // namespace
}  // namespace treespec
