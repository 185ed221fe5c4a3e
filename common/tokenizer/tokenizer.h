// Hugging Face tokenizer.json, byte-level BPE (GPT-2 / Llama 3 / Qwen style).
#ifndef TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_
#define TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace treespec {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text -> ids as HF `tokenizer.encode(text, add_special_tokens=False)` does: added/special
  // tokens in the text are matched first, the rest pre-tokenized and BPE-merged.
  // INVALID_ARGUMENT for text that is not valid UTF-8 (with the byte offset).
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const {
    return EncodeAtMost(text, std::numeric_limits<size_t>::max());
  }
  // Encode, but OUT_OF_RANGE as soon as the ids are certainly more than `max_tokens`: the
  // work stops there, so a text far over a server's context costs about what max_tokens ids
  // do, not what the whole text would.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeAtMost(const std::string& text,
                                                            size_t max_tokens) const = 0;

  // Ids -> bytes (UTF-8 when the ids form complete characters). Special tokens included.
  // INVALID_ARGUMENT for ids outside [0, vocab_size).
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  virtual int vocab_size() const = 0;  // including added tokens
  // Id of a token string ("<|endoftext|>"), or -1.
  virtual int32_t TokenToId(const std::string& token) const = 0;
};

// Loads a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2 style). Settings
// that would change results but are not supported are INVALID_ARGUMENT naming the field.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& tokenizer_json_path);

// The tokenizer a model directory ships: its tokenizer.json, else Kimi-K2's tiktoken.model
// (tiktoken.h) when tokenizer_config.json names its TikTokenTokenizer. NOT_FOUND when `dir`
// holds neither file; UNIMPLEMENTED for a tiktoken.model of another tokenizer class (its
// pre-tokenizer lives in that model's own code).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& dir);

// The same from the JSON text itself; `origin` names the source in error messages.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(
    std::string_view json_text, std::string_view origin = "tokenizer.json");

// Streams text for a growing id sequence without ever splitting a UTF-8 character:
// Push(ids) returns the newly completed text; bytes of an unfinished character wait.
// Everything returned is valid UTF-8 (it can go into a proto `string`): bytes that can never
// become a character (a stray continuation byte, a sequence cut short by a byte that cannot
// continue it) come out as U+FFFD, one per maximal ill-formed subpart, so the concatenation of
// all Push and Flush results equals utf8::ToValidLossy(Decode(all ids)), which is what Hugging
// Face's decode returns. Not thread-safe; use one per stream.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // INVALID_ARGUMENT (from Decode) leaves the decoder as it was.
  absl::StatusOr<std::string> Push(absl::Span<const int32_t> ids);
  // Whatever is held back at the end: an incomplete character, as one U+FFFD ("" if none).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes of an incomplete trailing UTF-8 sequence
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_
