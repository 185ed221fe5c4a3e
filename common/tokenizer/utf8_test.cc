#include "common/tokenizer/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace treespec::utf8 {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, DecodesEachLength) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
  Step step = Decode(s, 0);
  EXPECT_EQ(step.kind, StepKind::kValid);
  EXPECT_EQ(step.length, 1);
  EXPECT_EQ(step.code_point, U'a');
  step = Decode(s, 1);
  EXPECT_EQ(step.length, 2);
  EXPECT_EQ(step.code_point, U'\u00E9');
  step = Decode(s, 3);
  EXPECT_EQ(step.length, 3);
  EXPECT_EQ(step.code_point, U'\u20AC');
  step = Decode(s, 6);
  EXPECT_EQ(step.length, 4);
  EXPECT_EQ(step.code_point, U'\U0001F600');
}

TEST(Utf8Test, FindInvalidGivesOffsetOfFirstBadSequence) {
  EXPECT_EQ(FindInvalid(""), std::string::npos);
  EXPECT_EQ(FindInvalid("plain ascii"), std::string::npos);
  EXPECT_EQ(FindInvalid("\xF0\x9F\x98\x80 ok \xE2\x82\xAC"), std::string::npos);
  EXPECT_EQ(FindInvalid("ab\xFF"
                        "c"),
            2u);                                   // never a lead byte
  EXPECT_EQ(FindInvalid("abc\x80"), 3u);           // stray continuation
  EXPECT_EQ(FindInvalid("x\xC0\xAF"), 1u);         // overlong '/'
  EXPECT_EQ(FindInvalid("xy\xE0\x80\xAF"), 2u);    // overlong 3-byte
  EXPECT_EQ(FindInvalid("\xED\xA0\x80"), 0u);      // surrogate U+D800
  EXPECT_EQ(FindInvalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FindInvalid("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(FindInvalid("ok\xE2\x82"), 2u);  // truncated at the end
  EXPECT_EQ(FindInvalid("\xC3\xA9\xC3"), 2u);
  EXPECT_EQ(FindInvalid("\xEF\xBF\xBF\xF4\x8F\xBF\xBF"), std::string::npos);  // U+FFFF, U+10FFFF
}

TEST(Utf8Test, CompletePrefixLengthHoldsOnlyCompletableTails) {
  EXPECT_EQ(CompletePrefixLength(""), 0u);
  EXPECT_EQ(CompletePrefixLength("abc"), 3u);
  EXPECT_EQ(CompletePrefixLength("a\xF0"), 1u);
  EXPECT_EQ(CompletePrefixLength("a\xF0\x9F"), 1u);
  EXPECT_EQ(CompletePrefixLength("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(CompletePrefixLength("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(CompletePrefixLength("a\xE2\x82"), 1u);
  // Can never complete: they are the caller's to replace, not to hold.
  EXPECT_EQ(CompletePrefixLength("a\x80"), 2u);
  EXPECT_EQ(CompletePrefixLength("a\xE0\x80"), 3u);  // E0 needs A0..BF next
  EXPECT_EQ(CompletePrefixLength("a\xED\xA0"), 3u);  // would be a surrogate
  EXPECT_EQ(CompletePrefixLength("a\xFF"), 2u);
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  // Expectations as Rust's String::from_utf8_lossy (and Python's errors="replace") give them.
  EXPECT_EQ(ToValidLossy("abc"), "abc");
  EXPECT_EQ(ToValidLossy("\xF0\x9F\x98"), kFffd);  // one truncated char
  EXPECT_EQ(ToValidLossy("\xF0\x9F\x98"
                         "A"),
            kFffd + "A");
  EXPECT_EQ(ToValidLossy("\xE0\x80\xAF"), kFffd + kFffd + kFffd);  // overlong: 3 subparts
  EXPECT_EQ(ToValidLossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(ToValidLossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(ToValidLossy("\xC2\x41"), kFffd + "A");
  EXPECT_EQ(ToValidLossy("\x80\x80"), kFffd + kFffd);
  EXPECT_EQ(ToValidLossy("\xE2\x82\xAC\xE2\x82"), "\xE2\x82\xAC" + kFffd);
}

TEST(Utf8Test, AppendLossyHoldsIncompleteTailUnlessAtEnd) {
  std::string out;
  EXPECT_EQ(AppendLossy("ab\xF0\x9F", /*at_end=*/false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendLossy("ab\xF0\x9F", /*at_end=*/true, &out), 4u);
  EXPECT_EQ(out, "ab" + kFffd);
  out.clear();
  EXPECT_EQ(AppendLossy("ab\x80", /*at_end=*/false, &out), 3u);  // hopeless: not held
  EXPECT_EQ(out, "ab" + kFffd);
}

TEST(Utf8Test, AppendCodePointRoundTrips) {
  for (const char32_t cp : {U'\0', U'A', U'\u00E9', U'\u07FF', U'\u0800', U'\uFFFD', U'\U00010000',
                            U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    AppendCodePoint(cp, &s);
    const Step step = Decode(s, 0);
    EXPECT_EQ(step.kind, StepKind::kValid);
    EXPECT_EQ(step.length, static_cast<int>(s.size()));
    EXPECT_EQ(step.code_point, cp);
  }
}

}  // namespace
}  // namespace treespec::utf8
