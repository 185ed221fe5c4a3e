#include "common/tokenizer/tokenizer.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;
using ::testing::HasSubstr;

// GPT-2's bytes_to_unicode written out again from the Python original, independently of
// byte_level.cc, so that the vocabulary below does not trust the code under test.
std::string SpellByte(int byte) {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  const int cp = cs[std::find(bs.begin(), bs.end(), byte) - bs.begin()];
  std::string out;
  utf8::AppendCodePoint(static_cast<char32_t>(cp), &out);
  return out;
}

const std::string kG = "\xC4\xA0";  // "Ġ", the spelling of ' '

// The hand-made tokenizer most tests use. Ids:
//   0..255    one token per byte, id = byte value
//   256..266  merge results, in merge order (rank = id - 256):
//             Ġt ll ell he hell hello Ġthe Ġhello aa 34 ĠĠ
//   267       "xyz": in the vocab, reachable by no merge (for ignore_merges)
//   268..271  added: <|endoftext|> <|im_start|> <|im (special), "hello world" (not special)
Json BaseTokenizerJson() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[SpellByte(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {kG, "t"},        {"l", "l"},    {"e", "ll"}, {"h", "e"}, {"h", "ell"}, {"hell", "o"},
      {kG + "t", "he"}, {kG, "hello"}, {"a", "a"},  {"3", "4"}, {kG, kG}};
  Json merge_list = Json::array();
  int32_t id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  vocab["xyz"] = id++;
  auto added = [](int32_t token_id, const std::string& content, bool special) {
    return Json{{"id", token_id},    {"content", content}, {"single_word", false},
                {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                {"special", special}};
  };
  return Json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens",
               Json::array({added(268, "<|endoftext|>", true), added(269, "<|im_start|>", true),
                            added(270, "<|im", true), added(271, "hello world", false)})},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"post_processor",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", false},
                {"use_regex", true}}},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}}}};
}

// The Llama 3 arrangement: a Split with its regex, then ByteLevel without one; ignore_merges.
Json Llama3StyleJson() {
  Json json = BaseTokenizerJson();
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array({{{"type", "Split"},
                     {"pattern",
                      {{"Regex",
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", false}}})}};
  json["model"]["ignore_merges"] = true;
  return json;
}

std::unique_ptr<Tokenizer> MustParse(const Json& json) {
  auto tokenizer = ParseTokenizerJson(json.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

Ids MustEncode(const Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : Ids{};
}

std::string MustDecode(const Tokenizer& tokenizer, const Ids& ids) {
  auto text = tokenizer.Decode(ids);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = MustParse(BaseTokenizerJson());
    ASSERT_NE(tokenizer_, nullptr);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TokenizerTest, VocabAndTokenLookup) {
  EXPECT_EQ(tokenizer_->vocab_size(), 272);
  EXPECT_EQ(tokenizer_->TokenToId("a"), 'a');
  EXPECT_EQ(tokenizer_->TokenToId(kG), ' ');
  EXPECT_EQ(tokenizer_->TokenToId("hello"), 261);
  EXPECT_EQ(tokenizer_->TokenToId(kG + "hello"), 263);
  EXPECT_EQ(tokenizer_->TokenToId("<|endoftext|>"), 268);
  EXPECT_EQ(tokenizer_->TokenToId("hello world"), 271);
  EXPECT_EQ(tokenizer_->TokenToId(" hello"), -1);  // token strings are byte-level spellings
  EXPECT_EQ(tokenizer_->TokenToId("nope"), -1);
}

// EncodeAtMost equals Encode up to the bound and is OUT_OF_RANGE past it, including for a text
// refused by its length alone (every id stands for at most the longest token's bytes).
TEST_F(TokenizerTest, EncodeAtMostStopsOnceTheTextIsCertainlyLonger) {
  const std::string text = "hello help <|endoftext|> the aaa";
  const Ids all = MustEncode(*tokenizer_, text);
  ASSERT_GT(all.size(), 4u);
  absl::StatusOr<Ids> within = tokenizer_->EncodeAtMost(text, all.size());
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(*within, all);
  for (size_t max : {size_t{0}, size_t{2}, all.size() - 1}) {
    const absl::StatusOr<Ids> over = tokenizer_->EncodeAtMost(text, max);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << max;
    EXPECT_THAT(over.status().message(), HasSubstr(absl::StrCat("longer than ", max, " tokens")));
  }
  const std::string far(1 << 20, 'x');
  EXPECT_EQ(tokenizer_->EncodeAtMost(far, 1000).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tokenizer_->EncodeAtMost("", 0).value(), Ids{});
  // Invalid UTF-8 is still named as such, whatever the bound.
  EXPECT_EQ(tokenizer_->EncodeAtMost("a\xff", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenizerTest, EncodesByMergeRank) {
  // h e l l o: ll (rank 1), then e+ll (2) before h+e (3), then h+ell, hell+o.
  EXPECT_EQ(MustEncode(*tokenizer_, "hello"), (Ids{261}));
  EXPECT_EQ(MustEncode(*tokenizer_, " hello"), (Ids{263}));
  // No 'll' here, so h+e wins.
  EXPECT_EQ(MustEncode(*tokenizer_, "help"), (Ids{259, 'l', 'p'}));
  // Ġ t h e: Ġ+t (0), h+e (3), then Ġt+he (6).
  EXPECT_EQ(MustEncode(*tokenizer_, " the"), (Ids{262}));
  EXPECT_EQ(MustEncode(*tokenizer_, "the"), (Ids{'t', 259}));
  // Equal ranks: leftmost first.
  EXPECT_EQ(MustEncode(*tokenizer_, "aaa"), (Ids{264, 'a'}));
  EXPECT_EQ(MustEncode(*tokenizer_, ""), (Ids{}));
}

TEST_F(TokenizerTest, Gpt2PreTokenizerSplitsBeforeMerging) {
  // "hello" and " world" are separate pieces; no merge crosses them.
  EXPECT_EQ(MustEncode(*tokenizer_, "hello worl"), (Ids{261, ' ', 'w', 'o', 'r', 'l'}));
  // \s+(?!\S) leaves the last space to the word: "a", "  ", " b" (ĠĠ is one merge).
  EXPECT_EQ(MustEncode(*tokenizer_, "a   b"), (Ids{'a', 266, ' ', 'b'}));
  // Contractions are their own pieces.
  EXPECT_EQ(MustEncode(*tokenizer_, "he'll"), (Ids{259, '\'', 257}));
  // ' ?\p{N}+' keeps a digit run together, so 3+4 merges inside it.
  EXPECT_EQ(MustEncode(*tokenizer_, "12345"), (Ids{'1', '2', 265, '5'}));
  EXPECT_EQ(MustEncode(*tokenizer_, "x\n\ny"), (Ids{'x', '\n', '\n', 'y'}));
}

TEST_F(TokenizerTest, MultibyteTextGoesThroughBytes) {
  // é = C3 A9, 😀 = F0 9F 98 80: no merges, one token per byte.
  EXPECT_EQ(MustEncode(*tokenizer_, "\xC3\xA9"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(MustEncode(*tokenizer_, " \xF0\x9F\x98\x80"), (Ids{' ', 0xF0, 0x9F, 0x98, 0x80}));
}

TEST_F(TokenizerTest, AddedTokensMatchFirstAndLongest) {
  EXPECT_EQ(MustEncode(*tokenizer_, "<|endoftext|>"), (Ids{268}));
  EXPECT_EQ(MustEncode(*tokenizer_, "hello<|endoftext|> hello"), (Ids{261, 268, 263}));
  // "<|im_start|>" beats its prefix "<|im"; a lone "<|im" is still found.
  EXPECT_EQ(MustEncode(*tokenizer_, "<|im_start|>the"), (Ids{269, 't', 259}));
  EXPECT_EQ(MustEncode(*tokenizer_, "<|im_end|>"), (Ids{270, '_', 'e', 'n', 'd', '|', '>'}));
  // A non-special added token with a space in it, matched even inside a word.
  EXPECT_EQ(MustEncode(*tokenizer_, "xhello worlds"), (Ids{'x', 271, 's'}));
  // An incomplete special token is plain text.
  EXPECT_EQ(MustEncode(*tokenizer_, "<|endoftext"),
            (Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'}));
}

TEST_F(TokenizerTest, DecodeUndoesByteLevelAndKeepsSpecialTokens) {
  EXPECT_EQ(MustDecode(*tokenizer_, {261, 263}), "hello hello");
  EXPECT_EQ(MustDecode(*tokenizer_, {268, ' ', 269, 270}), "<|endoftext|> <|im_start|><|im");
  // An added token whose content has a character outside the byte map decodes as it is.
  EXPECT_EQ(MustDecode(*tokenizer_, {271}), "hello world");
  EXPECT_EQ(MustDecode(*tokenizer_, {'\n', 266, 0xF0, 0x9F, 0x98, 0x80}), "\n  \xF0\x9F\x98\x80");
  EXPECT_EQ(MustDecode(*tokenizer_, {}), "");
  // A lone byte stays a byte: Decode is exact; the stream decoder makes it text.
  EXPECT_EQ(MustDecode(*tokenizer_, {0xF0}), "\xF0");
}

TEST_F(TokenizerTest, RoundTripsArbitraryText) {
  const std::vector<std::string> texts = {
      "def f(x):\n    return x ** 2  # square\n",
      "Hello, world! It's 2024; we've got \xE2\x82\xAC"
      "3.50 caf\xC3\xA9s.",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C "
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D",
      "tabs\tand\r\nCRLF  \n\n\n   trailing   ",
      "<|endoftext|>hello world<|im_start|>  <|im",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(MustDecode(*tokenizer_, MustEncode(*tokenizer_, text)), text);
  }
}

TEST_F(TokenizerTest, InvalidUtf8IsRejectedWithOffset) {
  for (const auto& [text, offset] : std::vector<std::pair<std::string, int>>{{"ab\xFF"
                                                                              "c",
                                                                              2},
                                                                             {"hello \x80", 6},
                                                                             {"\xC0\xAF", 0},
                                                                             {"ok \xED\xA0\x80", 3},
                                                                             {"abc\xE2\x82", 3}}) {
    auto ids = tokenizer_->Encode(text);
    ASSERT_FALSE(ids.ok()) << text;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("offset " + std::to_string(offset)), std::string::npos)
        << ids.status();
  }
}

TEST_F(TokenizerTest, DecodeRejectsIdsOutOfRange) {
  for (const int32_t bad : {272, -1, 91234}) {
    auto text = tokenizer_->Decode({'a', bad});
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(text.status().message(),
              "token id " + std::to_string(bad) + " out of range [0, 272)");
  }
}

TEST_F(TokenizerTest, DecodeRejectsIdsNoTokenHas) {
  Json json = BaseTokenizerJson();
  json["added_tokens"].push_back({{"id", 300}, {"content", "<gap>"}, {"special", true}});
  auto tokenizer = MustParse(json);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 301);
  EXPECT_EQ(MustDecode(*tokenizer, {300}), "<gap>");
  auto text = tokenizer->Decode({280});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("280"), std::string::npos);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizer runtimes replace malloc; glibc's statistics would not see their allocations.
extern "C" size_t __sanitizer_get_current_allocated_bytes();
size_t AllocatedBytes() { return __sanitizer_get_current_allocated_bytes(); }
#else
// Bytes malloc has handed out and not taken back: small chunks plus mmapped ones.
size_t AllocatedBytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}
#endif

// One id near 2^24 in a tiny file loads and works, and costs memory by the file's entries, not
// by its largest id (a table indexed by id would take 0.5 GB here).
TEST_F(TokenizerTest, HugeSparseIdCostsMemoryByEntriesNotById) {
  constexpr int32_t kFar = (1 << 24) - 1;  // the largest id a file may use
  Json json = BaseTokenizerJson();
  json["added_tokens"].push_back({{"id", kFar}, {"content", "<far>"}, {"special", true}});
  const std::string text = json.dump();
  const size_t before = AllocatedBytes();
  auto tokenizer = ParseTokenizerJson(text);
  const size_t held = AllocatedBytes() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_LT(held, size_t{16} << 20) << "bytes held by a tokenizer of 273 tokens";
  EXPECT_EQ((*tokenizer)->vocab_size(), kFar + 1);
  EXPECT_EQ(MustEncode(**tokenizer, "a<far>"), (Ids{'a', kFar}));
  EXPECT_EQ(MustDecode(**tokenizer, {'a', kFar}), "a<far>");
  auto gap = (*tokenizer)->Decode({kFar - 1});
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.status().message(), "token id 16777214 is in [0, 16777216) but no token has it");
}

TEST_F(TokenizerTest, Llama3StyleSplitAndIgnoreMerges) {
  auto llama = MustParse(Llama3StyleJson());
  ASSERT_NE(llama, nullptr);
  // \p{N}{1,3} cuts "12345" into "123" "45": 3 and 4 are in different pieces now.
  EXPECT_EQ(MustEncode(*llama, "12345"), (Ids{'1', '2', '3', '4', '5'}));
  EXPECT_EQ(MustEncode(*tokenizer_, "12345"), (Ids{'1', '2', 265, '5'}));
  // ignore_merges: a piece that is a vocab entry is taken whole.
  EXPECT_EQ(MustEncode(*llama, "xyz"), (Ids{267}));
  EXPECT_EQ(MustEncode(*tokenizer_, "xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(MustEncode(*llama, " hello<|endoftext|>"), (Ids{263, 268}));
  const std::string text = "I'M 12345 $x\n\n  y \xF0\x9F\x98\x80";
  EXPECT_EQ(MustDecode(*llama, MustEncode(*llama, text)), text);
}

TEST_F(TokenizerTest, PrefixSpaceGoesOnEverySegment) {
  Json json = BaseTokenizerJson();
  json["pre_tokenizer"]["add_prefix_space"] = true;
  auto tokenizer = MustParse(json);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(MustEncode(*tokenizer, "hello"), (Ids{263}));
  EXPECT_EQ(MustEncode(*tokenizer, " hello"), (Ids{263}));  // already starts with a space
  // Hugging Face pre-tokenizes each piece between added tokens on its own.
  EXPECT_EQ(MustEncode(*tokenizer, "hello<|endoftext|>hello"), (Ids{263, 268, 263}));
}

TEST_F(TokenizerTest, MergesAsPairs) {
  Json json = BaseTokenizerJson();
  Json pairs = Json::array();
  for (const Json& merge : json["model"]["merges"]) {
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    pairs.push_back(Json::array({s.substr(0, space), s.substr(space + 1)}));
  }
  json["model"]["merges"] = pairs;
  auto tokenizer = MustParse(json);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(MustEncode(*tokenizer, " hello the"), (Ids{263, 262}));
}

// Added tokens with lstrip / rstrip / single_word; expectations as Hugging Face's own tests of
// AddedVocabulary give them.
TEST_F(TokenizerTest, AddedTokenStripAndSingleWord) {
  Json json = BaseTokenizerJson();
  json["added_tokens"].push_back({{"id", 272},
                                  {"content", "<mask>"},
                                  {"lstrip", true},
                                  {"rstrip", true},
                                  {"single_word", false},
                                  {"normalized", false},
                                  {"special", true}});
  json["added_tokens"].push_back({{"id", 273},
                                  {"content", "ony"},
                                  {"single_word", true},
                                  {"normalized", true},
                                  {"special", false}});
  auto tokenizer = MustParse(json);
  ASSERT_NE(tokenizer, nullptr);
  // The spaces around <mask> are swallowed by it.
  EXPECT_EQ(MustEncode(*tokenizer, "Hi <mask> there"), (Ids{'H', 'i', 272, 't', 259, 'r', 'e'}));
  // Tabs too (White_Space); the second mask's lstrip finds no space left to take.
  EXPECT_EQ(MustEncode(*tokenizer, "x\t<mask>\t<mask>\xE2\x80\x80"), (Ids{'x', 272, 272}));
  // "ony" only as a word of its own.
  EXPECT_EQ(MustEncode(*tokenizer, "ony Anthony ony,"),
            (Ids{273, ' ', 'A', 'n', 't', 'h', 'o', 'n', 'y', ' ', 273, ','}));
  EXPECT_EQ(MustEncode(*tokenizer, "pony_"), (Ids{'p', 'o', 'n', 'y', '_'}));
}

TEST_F(TokenizerTest, NfcNormalizer) {
  Json json = BaseTokenizerJson();
  json["normalizer"] = {{"type", "NFC"}};
  auto tokenizer = MustParse(json);
  ASSERT_NE(tokenizer, nullptr);
  // "e" + U+0301 (combining acute) composes to é = C3 A9.
  EXPECT_EQ(MustEncode(*tokenizer, "e\xCC\x81"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(MustEncode(*tokenizer_, "e\xCC\x81"), (Ids{'e', 0xCC, 0x81}));
  EXPECT_EQ(MustEncode(*tokenizer, "hello<|endoftext|>"), (Ids{261, 268}));
}

// Every unsupported setting is refused at load time, naming the field.
TEST(TokenizerLoadTest, UnsupportedSettingsNameTheField) {
  struct Case {
    std::function<void(Json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
      {[](Json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {[](Json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {[](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix"},
      {[](Json& j) { j["model"]["mystery"] = 1; }, "model.mystery"},
      {[](Json& j) { j["model"]["merges"].push_back("q zz"); }, "model.merges[11]"},
      {[](Json& j) { j["model"]["merges"].push_back("a b c"); }, "model.merges[11]"},
      {[](Json& j) { j["model"]["vocab"]["dup"] = 5; }, "model.vocab gives id 5"},
      {[](Json& j) { j["model"]["vocab"]["neg"] = -3; }, "model.vocab[\"neg\"]"},
      {[](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type"},
      {[](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type"},
      {[](Json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer"},
      {[](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type"},
      {[](Json& j) {
         j["truncation"] = {{"max_length", 512}};
       },
       "truncation"},
      {[](Json& j) { j["added_tokens"][0]["id"] = 5; }, "added_tokens[0].id"},
      {[](Json& j) { j["added_tokens"][1]["content"] = "<|endoftext|>"; },
       "added_tokens[1].content"},
      {[](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", Json::array({{{"type", "Split"},
                                             {"pattern", {{"Regex", "(unclosed"}}},
                                             {"behavior", "Isolated"},
                                             {"invert", false}},
                                            {{"type", "ByteLevel"}, {"use_regex", false}}})}};
       },
       "pre_tokenizer.pretokenizers[0].pattern"},
      {[](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", Json::array({{{"type", "ByteLevel"}},
                                                              {{"type", "Split"},
                                                               {"pattern", {{"String", "x"}}},
                                                               {"behavior", "Isolated"}}})}};
       },
       "pre_tokenizer"},
  };
  for (const Case& c : cases) {
    Json json = BaseTokenizerJson();
    c.edit(json);
    auto tokenizer = ParseTokenizerJson(json.dump(), "my/tokenizer.json");
    ASSERT_FALSE(tokenizer.ok()) << c.field;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(tokenizer.status().message().find("my/tokenizer.json: " + c.field), 0u)
        << tokenizer.status();
  }
}

TEST(TokenizerLoadTest, BadJsonAndMissingFile) {
  auto parsed = ParseTokenizerJson("{\"model\": [1, 2", "broken.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("broken.json: not valid JSON"), std::string::npos);

  auto loaded = LoadTokenizer("/nonexistent/tokenizer.json");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerLoadTest, LoadsFromFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("tokenizer_test_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << BaseTokenizerJson().dump(2);
  }
  auto tokenizer = LoadTokenizer(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(MustEncode(**tokenizer, " hello"), (Ids{263}));
}

// Feeds ids one at a time and checks each piece of text is whole UTF-8 and that the pieces
// add up to the lossy decoding of everything.
void ExpectStreamsLikeDecode(const Tokenizer& tokenizer, const Ids& ids) {
  IncrementalDecoder decoder(&tokenizer);
  std::string streamed;
  for (const int32_t id : ids) {
    auto piece = decoder.Push({id});
    ASSERT_TRUE(piece.ok()) << piece.status();
    EXPECT_EQ(utf8::FindInvalid(*piece), std::string::npos) << "split character after id " << id;
    streamed += *piece;
  }
  const std::string tail = decoder.Flush();
  EXPECT_EQ(utf8::FindInvalid(tail), std::string::npos);
  streamed += tail;
  EXPECT_EQ(streamed, utf8::ToValidLossy(MustDecode(tokenizer, ids)));
}

TEST_F(TokenizerTest, IncrementalDecoderHoldsSplitCharacters) {
  const std::string text = "a\xF0\x9F\x98\x80 \xE2\x82\xAC\xC3\xA9 hello\xF0\x9F\x91\x8D";
  const Ids ids = MustEncode(*tokenizer_, text);
  ASSERT_EQ(ids.size(), 16u);  // a, 4 emoji bytes, Ġ, 3 euro bytes, 2 é bytes, Ġhello, 4 bytes

  IncrementalDecoder decoder(tokenizer_.get());
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(*decoder.Push({id}));
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", " ", "", "",
                                              "\xE2\x82\xAC", "", "\xC3\xA9", " hello", "", "", "",
                                              "\xF0\x9F\x91\x8D"}));
  EXPECT_EQ(decoder.Flush(), "");
  ExpectStreamsLikeDecode(*tokenizer_, ids);
}

TEST_F(TokenizerTest, IncrementalDecoderReplacesHopelessBytes) {
  const std::string fffd = "\xEF\xBF\xBD";
  IncrementalDecoder decoder(tokenizer_.get());
  EXPECT_EQ(*decoder.Push({0x80}), fffd);  // a stray continuation byte: out at once
  EXPECT_EQ(*decoder.Push({0xE2}), "");    // may still become a character
  EXPECT_EQ(*decoder.Push({0x82}), "");
  EXPECT_EQ(*decoder.Push({'A'}), fffd + "A");  // 'A' cannot continue E2 82
  EXPECT_EQ(*decoder.Push({0xF0, 0x9F}), "");
  EXPECT_EQ(decoder.Flush(), fffd);  // cut short at the end
  EXPECT_EQ(decoder.Flush(), "");

  // A bad id is an error and leaves what was held.
  EXPECT_EQ(*decoder.Push({0xC3}), "");
  auto bad = decoder.Push({999});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*decoder.Push({0xA9}), "\xC3\xA9");

  ExpectStreamsLikeDecode(*tokenizer_, {0x80, 0xE2, 0x82, 'A', 0xE0, 0x80, 0xED, 0xA0, 0x80, 0xF4,
                                        0x90, 0xF0, 0x9F, 0x98, 0x80, 0xF0, 0x9F});
}

TEST_F(TokenizerTest, IncrementalDecoderOnRandomIds) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, tokenizer_->vocab_size() - 1);
  std::uniform_int_distribution<int32_t> high_byte(0x80, 0xFF);
  for (int trial = 0; trial < 200; ++trial) {
    Ids ids;
    for (int i = 0; i < 30; ++i) ids.push_back(trial % 2 ? high_byte(rng) : any_id(rng));
    ExpectStreamsLikeDecode(*tokenizer_, ids);
  }
}

TEST_F(TokenizerTest, ConcurrentEncodesAgree) {
  // Distinct words keep the shared cache inserting (and clearing full shards) while other
  // threads read it.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::vector<std::string> texts;
  for (int t = 0; t < 16; ++t) {
    std::string text;
    for (int w = 0; w < 3000; ++w) {
      text += w % 7 == 0 ? " hello" : " ";
      for (int k = 0; k < 3 + w % 5; ++k) text.push_back(static_cast<char>(letter(rng)));
      if (w % 100 == 0) text += "<|endoftext|>\n";
    }
    texts.push_back(text);
  }
  // Expected results from a fresh tokenizer, one thread.
  auto reference = MustParse(BaseTokenizerJson());
  std::vector<Ids> expected;
  for (const std::string& text : texts) expected.push_back(MustEncode(*reference, text));

  constexpr int kThreads = 8;
  std::vector<std::vector<Ids>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = tokenizer_->Encode(texts[(i + t) % texts.size()]);
          results[t].push_back(ids.ok() ? *ids : Ids{});
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(results[t].size(), 3 * texts.size());
    for (size_t k = 0; k < results[t].size(); ++k) {
      EXPECT_EQ(results[t][k], expected[(k % texts.size() + t) % texts.size()])
          << "thread " << t << " call " << k;
    }
  }
}

// Encodes ~100 KB of this project's own C++ and prints the time: a sanity figure, not a
// benchmark (the pass condition is the round trip).
TEST(TokenizerLargeTest, LargeSourceFileRoundTrips) {
  std::string text;
  const std::filesystem::path dir =
      std::filesystem::path(TREESPEC_SOURCE_DIR) / "common" / "tokenizer";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream contents;
    contents << in.rdbuf();
    text += contents.str();
    if (text.size() >= 100 * 1024) break;
  }
  while (text.size() < 100 * 1024) text += text;  // in case the tree is still small
  text.resize(100 * 1024);
  text.resize(utf8::CompletePrefixLength(text));

  for (const bool llama_style : {false, true}) {
    auto tokenizer = MustParse(llama_style ? Llama3StyleJson() : BaseTokenizerJson());
    ASSERT_NE(tokenizer, nullptr);
    for (const char* pass : {"cold", "warm"}) {
      const auto start = std::chrono::steady_clock::now();
      const Ids ids = MustEncode(*tokenizer, text);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      std::printf("[ timing ] %s pre-tokenizer, %zu bytes -> %zu ids, %s cache: %.2f ms\n",
                  llama_style ? "Llama-3 Split" : "GPT-2 ByteLevel", text.size(), ids.size(), pass,
                  ms);
      EXPECT_EQ(MustDecode(*tokenizer, ids), text);
    }
  }
}

}  // namespace
}  // namespace treespec
