// Fuzzes loading a tokenizer.json (ParseTokenizerJson) from arbitrary bytes. A file that loads
// must give a working tokenizer: on a fixed set of probe texts Encode either refuses with a
// status or returns ids in [0, vocab_size) that Decode accepts, and streaming decode of those
// ids gives valid UTF-8.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace treespec {
namespace {

// Text that reaches the pre-tokenizer's branches (letters, digits, punctuation, runs of
// whitespace, line breaks, non-ASCII, combining marks for NFC) and common added tokens.
constexpr std::string_view kProbes[] = {
    "",
    "Hello, world! It's 2024: x += 1234567;",
    "  leading and trailing spaces \t\n\r\n  ",
    "h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82",
    "e\xCC\x81 A\xCC\x8A \xEF\xAC\x81",  // decomposed é and Å, the ﬁ ligature
    "<|endoftext|><|im_start|>user\nhi<|im_end|>",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
};

void FuzzTokenizerJson(std::string_view json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ParseTokenizerJson(json, "fuzz.json");
  if (!tokenizer.ok()) return;
  const Tokenizer& t = **tokenizer;
  FUZZ_CHECK(t.vocab_size() > 0, std::to_string(t.vocab_size()));
  for (std::string_view probe : kProbes) {
    absl::StatusOr<std::vector<int32_t>> ids = t.Encode(std::string(probe));
    if (!ids.ok()) continue;
    for (int32_t id : *ids) {
      FUZZ_CHECK(id >= 0 && id < t.vocab_size(), std::to_string(id));
    }
    absl::StatusOr<std::string> decoded = t.Decode(*ids);
    FUZZ_CHECK(decoded.ok(), std::string(decoded.status().message()));
    IncrementalDecoder decoder(&t);
    std::string streamed;
    for (int32_t id : *ids) {
      absl::StatusOr<std::string> piece = decoder.Push({id});
      FUZZ_CHECK(piece.ok(), std::string(piece.status().message()));
      streamed += *piece;
    }
    streamed += decoder.Flush();
    FUZZ_CHECK(streamed == utf8::ToValidLossy(*decoded), "streamed text differs from Decode");
  }
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  treespec::FuzzTokenizerJson(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
