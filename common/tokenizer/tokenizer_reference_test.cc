// Checks Encode/Decode against vectors that Hugging Face `tokenizers` produced for real
// tokenizer.json files (tests/data/*.json). A missing vector file is a failure, not a skip:
// these are the only cross-checks against the implementation we claim to match.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tiktoken.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using Json = nlohmann::json;

const std::filesystem::path kSourceDir = TREESPEC_SOURCE_DIR;

class TokenizerReferenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerReferenceTest, MatchesHuggingFace) {
  const std::filesystem::path vectors_path = kSourceDir / GetParam();
  std::ifstream in(vectors_path);
  ASSERT_TRUE(in) << "reference vectors missing: " << vectors_path;
  std::stringstream contents;
  contents << in.rdbuf();
  const Json vectors = Json::parse(contents.str(), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(vectors.is_object() && vectors.contains("tokenizer_json") &&
              vectors["tokenizer_json"].is_string() && vectors.contains("cases") &&
              vectors["cases"].is_array())
      << vectors_path << " is not {\"tokenizer_json\": ..., \"cases\": [...]}";
  ASSERT_FALSE(vectors["cases"].empty()) << vectors_path << " has no cases";

  const std::filesystem::path tokenizer_path =
      kSourceDir / vectors["tokenizer_json"].get<std::string>();
  auto tokenizer = LoadTokenizer(tokenizer_path.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  int checked = 0;
  for (size_t i = 0; i < vectors["cases"].size(); ++i) {
    const Json& c = vectors["cases"][i];
    ASSERT_TRUE(c.contains("text") && c.contains("ids") && c.contains("decoded")) << "case " << i;
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    const std::string decoded = c["decoded"].get<std::string>();
    SCOPED_TRACE(testing::Message() << "case " << i << ": " << Json(text).dump());

    auto encoded = (*tokenizer)->Encode(text);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ(*encoded, ids);

    // Hugging Face decodes to a Rust String, replacing bytes that are not UTF-8 with U+FFFD;
    // our Decode returns the bytes themselves, so compare after the same replacement.
    auto bytes = (*tokenizer)->Decode(ids);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(utf8::ToValidLossy(*bytes), decoded);

    // Streaming one id at a time must give the same text.
    IncrementalDecoder stream(tokenizer->get());
    std::string streamed;
    for (const int32_t id : ids) {
      auto piece = stream.Push({id});
      ASSERT_TRUE(piece.ok()) << piece.status();
      streamed += *piece;
    }
    streamed += stream.Flush();
    EXPECT_EQ(streamed, decoded);
    ++checked;
  }
  std::printf("[ vectors] %s: %d cases\n", GetParam(), checked);
}

// The same vocabulary written as a tiktoken model (each token's bytes ranked by its id, the
// file's regex, its added tokens as specials) must give Hugging Face's ids too: for a BPE whose
// merges were learned in id order, tiktoken's rank merging is the same algorithm.
TEST_P(TokenizerReferenceTest, TiktokenFormOfTheVocabularyMatchesHuggingFace) {
  std::ifstream in(kSourceDir / GetParam());
  ASSERT_TRUE(in) << GetParam();
  const Json vectors = Json::parse(in);
  const std::filesystem::path tokenizer_path =
      kSourceDir / vectors["tokenizer_json"].get<std::string>();
  std::ifstream tin(tokenizer_path);
  const Json file = Json::parse(tin);
  auto hf = LoadTokenizer(tokenizer_path.string());
  ASSERT_TRUE(hf.ok()) << hf.status();

  TiktokenOptions options;
  std::set<int32_t> added;
  for (const Json& t : file["added_tokens"]) {
    AddedToken token;
    token.id = t["id"].get<int32_t>();
    token.content = t["content"].get<std::string>();
    token.special = true;
    added.insert(token.id);
    options.special.push_back(token);
  }
  const Json& pre = file["pre_tokenizer"];
  if (pre["type"] == "ByteLevel") {
    options.pattern = std::string(kGpt2Pattern);
  } else {
    ASSERT_EQ(pre["type"], "Sequence");
    options.pattern = pre["pretokenizers"][0]["pattern"]["Regex"].get<std::string>();
  }
  std::vector<std::pair<std::string, int32_t>> ranks;
  for (int32_t id = 0; id < (*hf)->vocab_size(); ++id) {
    if (added.count(id)) continue;
    auto bytes = (*hf)->Decode({id});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ranks.emplace_back(*bytes, id);
  }
  auto tiktoken = BuildTiktokenTokenizer(ranks, options, "test");
  ASSERT_TRUE(tiktoken.ok()) << tiktoken.status();
  int checked = 0;
  for (const Json& c : vectors["cases"]) {
    auto ids = (*tiktoken)->Encode(c["text"].get<std::string>());
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << Json(c["text"]).dump();
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Files, TokenizerReferenceTest,
                         ::testing::Values("tests/data/tokenizer_reference.json",
                                           "tests/data/tokenizer_reference_llama3_style.json"),
                         [](const testing::TestParamInfo<const char*>& param) {
                           return std::string(param.index == 0 ? "TinyTarget" : "Llama3Style");
                         });

}  // namespace
}  // namespace treespec
