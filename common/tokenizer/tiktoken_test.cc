#include "common/tokenizer/tiktoken.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/regex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Matches(std::string_view pattern, std::string_view text) {
  auto regex = Regex::Compile(TiktokenToPcre2Pattern(pattern));
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<MatchSpan> spans;
  EXPECT_TRUE((*regex)->FindAll(text, &spans).ok());
  std::vector<std::string> out;
  for (const auto& [begin, end] : spans) out.emplace_back(text.substr(begin, end - begin));
  return out;
}

TEST(TiktokenPatternTest, ClassIntersectionBecomesALookahead) {
  EXPECT_EQ(TiktokenToPcre2Pattern(R"([\p{L}&&[^\p{Han}]]+)"), R"((?:(?=[^\p{Han}])[\p{L}])+)");
  EXPECT_EQ(TiktokenToPcre2Pattern(R"([a-z&&aeiou])"), R"((?:(?=[aeiou])[a-z]))");
  // Classes without `&&`, escapes and the rest pass through.
  EXPECT_EQ(TiktokenToPcre2Pattern(R"([^\s\p{L}\[\]]+|\p{N}{1,3}|[]a])"),
            R"([^\s\p{L}\[\]]+|\p{N}{1,3}|[]a])");
  EXPECT_THAT(Matches(R"([\p{L}&&[^\p{Han}]]+)", "abc中文déf"), ElementsAre("abc", "déf"));
}

TEST(TiktokenPatternTest, KimiPreTokenizer) {
  EXPECT_THAT(Matches(kKimiPattern, "Hello世界 don't 12345\n\n  x"),
              ElementsAre("Hello", "世界", " don't", " ", "123", "45", "\n\n", " ", " x"));
  // Upper-then-lower words, a Han run inside Latin text, punctuation runs with their newline.
  EXPECT_THAT(Matches(kKimiPattern, "HTTPServer中文API!?\n"),
              ElementsAre("HTTPServer", "中文", "API", "!?\n"));
}

TEST(TiktokenChunkingTest, CutsEveryNCharactersThenLongRuns) {
  auto chunks = [](std::string_view text, TextChunking c) {
    std::vector<std::string> out;
    for (std::string_view s : SplitIntoChunks(text, c)) out.emplace_back(s);
    return out;
  };
  EXPECT_THAT(chunks("abcdefghij", {5, 0}), ElementsAre("abcde", "fghij"));
  // As tokenization_kimi.py's _split_whitespaces_or_nonwhitespaces(s, 3).
  EXPECT_THAT(chunks("aaaa  bb", {0, 3}), ElementsAre("aaa", "a  bb"));
  EXPECT_THAT(chunks("ééééé", {0, 2}), ElementsAre("éé", "éé", "é"));  // characters, not bytes
  EXPECT_THAT(chunks("", {5, 3}), ElementsAre());
  EXPECT_THAT(chunks("ab", {0, 0}), ElementsAre("ab"));
}

// A Kimi-K2-shaped tokenizer directory: every byte, a few merges, special-token names.
class KimiTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) / "kimi_tokenizer_test").string();
    std::filesystem::create_directories(dir_);
    std::string model;
    int rank = 0;
    auto add = [&](const std::string& bytes) {
      absl::StrAppend(&model, absl::Base64Escape(bytes), " ", rank++, "\n");
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
    for (const char* t : {"xy", "ab", " t", "he", " the", "abc"}) add(t);
    base_ = rank;
    std::ofstream(dir_ + "/tiktoken.model") << model;
    std::ofstream(dir_ + "/tokenizer_config.json")
        << absl::StrCat(R"({"tokenizer_class": "TikTokenTokenizer", "added_tokens_decoder": {)",
                        "\"", base_, R"(": {"content": "[BOS]", "special": true}, ")", base_ + 1,
                        R"(": {"content": "[EOS]", "special": true}, ")", base_ + 3,
                        R"(": {"content": "<|im_end|>", "special": true}}})");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  int base_ = 0;
};

TEST_F(KimiTokenizerTest, EncodesMergesSpecialTokensAndReservedNames) {
  auto tok = LoadKimiTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), base_ + 258);
  EXPECT_EQ((*tok)->TokenToId("[BOS]"), base_);
  EXPECT_EQ((*tok)->TokenToId("<|im_end|>"), base_ + 3);
  EXPECT_EQ((*tok)->TokenToId(absl::StrCat("<|reserved_token_", base_ + 2, "|>")), base_ + 2);
  // "abc" is a token (taken whole); " the" merges " t" + "he" (both ranked before " the").
  auto ids = (*tok)->Encode("[BOS]abc the<|im_end|>");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(base_, 256 + 5, 256 + 4, base_ + 3));
  auto text = (*tok)->Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "[BOS]abc the<|im_end|>");
}

TEST_F(KimiTokenizerTest, LongRunsAreCutAt25000Characters) {
  auto tok = LoadKimiTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // 24,999 'a' then "xy": one run of 25,001 letters, cut after 25,000, which separates x from
  // y; a shorter run keeps the "xy" merge.
  auto cut = (*tok)->Encode(std::string(24999, 'a') + "xy");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->size(), 25001u);
  EXPECT_EQ(cut->back(), 'y');
  auto whole = (*tok)->Encode(std::string(24990, 'a') + "xy");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), 24991u);
  EXPECT_EQ(whole->back(), 256);  // "xy"
}

TEST_F(KimiTokenizerTest, AModelDirectoryPicksItsOwnTokenizer) {
  auto tok = LoadModelTokenizer(dir_);  // no tokenizer.json: the tiktoken model
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->TokenToId("[EOS]"), base_ + 1);
  // Another tokenizer class's tiktoken.model has its pre-tokenizer in its own code.
  std::ofstream(dir_ + "/tokenizer_config.json") << R"({"tokenizer_class": "OtherTokenizer"})";
  EXPECT_EQ(LoadModelTokenizer(dir_).status().code(), absl::StatusCode::kUnimplemented);
  std::filesystem::remove(dir_ + "/tiktoken.model");
  EXPECT_EQ(LoadModelTokenizer(dir_).status().code(), absl::StatusCode::kNotFound);
}

TEST(TiktokenRanksTest, BadFilesNameTheLine) {
  EXPECT_THAT(std::string(ParseTiktokenRanks("YQ== 0\nYg==\n", "m").status().message()),
              HasSubstr("m line 2"));
  EXPECT_THAT(std::string(ParseTiktokenRanks("YQ== 0\nYQ== 1\n", "m").status().message()),
              HasSubstr("given on line 1"));
  EXPECT_THAT(std::string(ParseTiktokenRanks("YQ== 0\nYg== 0\n", "m").status().message()),
              HasSubstr("rank 0 was given on line 1"));
  EXPECT_THAT(std::string(ParseTiktokenRanks("!!! 0\n", "m").status().message()),
              HasSubstr("base64"));
  auto ranks = ParseTiktokenRanks("YQ== 0\r\n\nYg== 1\n", "m");
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(ranks->size(), 2u);
  // A model without every byte cannot encode arbitrary text.
  auto missing = BuildTiktokenTokenizer(*ranks, TiktokenOptions{"\\S+", {}, {}}, "m");
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("byte 0x00"));
}

}  // namespace
}  // namespace treespec
