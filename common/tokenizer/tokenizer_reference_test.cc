// Checks Encode/Decode against vectors that Hugging Face `tokenizers` produced for real
// tokenizer.json files (tests/data/*.json). A missing vector file is a failure, not a skip:
// these are the only cross-checks against the implementation we claim to match.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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

INSTANTIATE_TEST_SUITE_P(Files, TokenizerReferenceTest,
                         ::testing::Values("tests/data/tokenizer_reference.json",
                                           "tests/data/tokenizer_reference_llama3_style.json"),
                         [](const testing::TestParamInfo<const char*>& param) {
                           return std::string(param.index == 0 ? "TinyTarget" : "Llama3Style");
                         });

}  // namespace
}  // namespace treespec
