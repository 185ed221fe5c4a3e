#include "common/tokenizer/regex.h"

#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> Pieces(std::string_view pattern, std::string_view text) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  if (!regex.ok()) return {};
  std::vector<MatchSpan> spans;
  const absl::Status status = (*regex)->FindAll(text, &spans);
  EXPECT_TRUE(status.ok()) << status;
  std::vector<std::string> pieces;
  for (const auto& [start, end] : spans) pieces.emplace_back(text.substr(start, end - start));
  return pieces;
}

TEST(RegexTest, Gpt2Pattern) {
  EXPECT_EQ(Pieces(kGpt2Pattern, "Hello world's  123 foo!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 123", " foo", "!!", "\n"}));
  // Unicode letters and numbers: \p{L} covers é and CJK, \p{N} covers Arabic-Indic digits.
  EXPECT_EQ(
      Pieces(kGpt2Pattern, "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xD9\xA3\xD9\xA4"),
      (std::vector<std::string>{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD", " \xD9\xA3\xD9\xA4"}));
}

TEST(RegexTest, Llama3Pattern) {
  EXPECT_EQ(Pieces(kLlama3Pattern, "I'M 12345 $x\n\n  y"),
            (std::vector<std::string>{"I", "'M", " ", "123", "45", " $", "x", "\n\n", " ", " y"}));
}

TEST(RegexTest, WhiteSpaceIncludesNextLine) {
  // Oniguruma's \s is White_Space, which has U+0085; PCRE2's own \s would not match it and
  // " \u0085" would come out as one punctuation piece.
  EXPECT_EQ(Pieces(kGpt2Pattern,
                   "a \xC2\x85"
                   "b"),
            (std::vector<std::string>{"a", " ", "\xC2\x85", "b"}));
  EXPECT_EQ(Pieces("\\s+", "x\xE3\x80\x80y"), (std::vector<std::string>{"\xE3\x80\x80"}));
}

TEST(RegexTest, RewritesWhiteSpaceClasses) {
  EXPECT_EQ(OnigurumaToPcre2Pattern("\\s+(?!\\S)"), "[\\s\\x{85}]+(?![^\\s\\x{85}])");
  EXPECT_EQ(OnigurumaToPcre2Pattern("[^\\s\\p{L}]"), "[^\\s\\x{85}\\p{L}]");
  EXPECT_EQ(OnigurumaToPcre2Pattern("[[:alpha:]\\s]x"), "[[:alpha:]\\s\\x{85}]x");
  EXPECT_EQ(OnigurumaToPcre2Pattern("[]\\s]"), "[]\\s\\x{85}]");
  EXPECT_EQ(OnigurumaToPcre2Pattern("\\\\s"), "\\\\s");  // an escaped backslash, then 's'
}

TEST(RegexTest, EmptyMatchesFollowOnigIteration) {
  // An empty match right after the previous match is skipped by one character.
  auto regex = Regex::Compile("a*");
  ASSERT_TRUE(regex.ok());
  std::vector<MatchSpan> spans;
  ASSERT_TRUE((*regex)->FindAll("baa", &spans).ok());
  EXPECT_EQ(spans, (std::vector<MatchSpan>{{0, 0}, {1, 3}}));
  ASSERT_TRUE((*regex)->FindAll("", &spans).ok());
  EXPECT_EQ(spans, (std::vector<MatchSpan>{{0, 0}}));
}

TEST(RegexTest, CompileErrorIsInvalidArgument) {
  auto regex = Regex::Compile("(unclosed");
  ASSERT_FALSE(regex.ok());
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(regex.status().message().find("does not compile"), std::string::npos);
}

}  // namespace
}  // namespace treespec
