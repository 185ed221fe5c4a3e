// Fuzzes the embedded target's tokenizer (models/tiny-target/tokenizer.json) with arbitrary
// bytes: Encode as text, and the same bytes read as token ids through the streaming decoder.
// Invariants beyond "no crash":
//   - Encode accepts exactly the valid UTF-8 inputs; its ids are in range, and decoding them
//     gives the text back (this tokenizer has no normalizer and no prefix space).
//   - IncrementalDecoder's pieces are valid UTF-8 and concatenate to ToValidLossy(Decode(ids));
//     a refused Push leaves the decoder as it was.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "fuzzer/FuzzedDataProvider.h"
#include "tests/fuzz/fuzz_util.h"

namespace treespec {
namespace {

const Tokenizer& TargetTokenizer() {
  static const Tokenizer* const tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        LoadTokenizer(TREESPEC_SOURCE_DIR "/models/tiny-target/tokenizer.json");
    FUZZ_CHECK(t.ok(), std::string(t.status().message()));
    return t->release();
  }();
  return *tokenizer;
}

void CheckEncode(const Tokenizer& tokenizer, const std::string& text) {
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text);
  const bool valid = utf8::FindInvalid(text) == std::string_view::npos;
  FUZZ_CHECK(ids.ok() == valid,
             ids.ok() ? "invalid UTF-8 was encoded" : std::string(ids.status().message()));
  if (!ids.ok()) return;
  for (int32_t id : *ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size(), std::to_string(id));
  }
  absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
  FUZZ_CHECK(decoded.ok(), std::string(decoded.status().message()));
  FUZZ_CHECK(*decoded == text, "Decode(Encode(text)) differs from text: '" + *decoded + "'");
}

void CheckStreamingDecode(const Tokenizer& tokenizer, const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  const int vocab = tokenizer.vocab_size();
  IncrementalDecoder decoder(&tokenizer);
  std::vector<int32_t> accepted;  // ids of every Push that succeeded
  std::string streamed;
  while (input.remaining_bytes() > 0) {
    std::vector<int32_t> chunk(input.ConsumeIntegralInRange<size_t>(0, 8));
    // Mostly valid ids, with the first ones out of range on either side now and then.
    for (int32_t& id : chunk) id = input.ConsumeIntegralInRange<int32_t>(-1, vocab);
    absl::StatusOr<std::string> piece = decoder.Push(chunk);
    if (!piece.ok()) continue;
    FUZZ_CHECK(utf8::FindInvalid(*piece) == std::string_view::npos, "Push gave invalid UTF-8");
    streamed += *piece;
    accepted.insert(accepted.end(), chunk.begin(), chunk.end());
  }
  const std::string tail = decoder.Flush();
  FUZZ_CHECK(utf8::FindInvalid(tail) == std::string_view::npos, "Flush gave invalid UTF-8");
  streamed += tail;
  absl::StatusOr<std::string> whole = tokenizer.Decode(accepted);
  FUZZ_CHECK(whole.ok(), std::string(whole.status().message()));
  FUZZ_CHECK(streamed == utf8::ToValidLossy(*whole), "streamed text differs from Decode");
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const treespec::Tokenizer& tokenizer = treespec::TargetTokenizer();
  treespec::CheckEncode(tokenizer, std::string(reinterpret_cast<const char*>(data), size));
  treespec::CheckStreamingDecode(tokenizer, data, size);
  return 0;
}
