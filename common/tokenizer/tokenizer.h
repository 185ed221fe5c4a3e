// Hugging Face tokenizer.json, byte-level BPE (GPT-2 / Llama 3 / Qwen style).
#ifndef TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_
#define TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
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
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const = 0;

  // Ids -> bytes (UTF-8 when the ids form complete characters). Special tokens included.
  // INVALID_ARGUMENT for ids outside [0, vocab_size).
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  virtual int vocab_size() const = 0;  // including added tokens
  // Id of a token string ("<|endoftext|>"), or -1.
  virtual int32_t TokenToId(const std::string& token) const = 0;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& tokenizer_json_path);

// Streams text for a growing id sequence without ever splitting a UTF-8 character:
// Push(ids) returns the newly completed text; bytes of an unfinished character wait.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  absl::StatusOr<std::string> Push(absl::Span<const int32_t> ids);
  // Whatever is held back at the end (an incomplete character, emitted as-is).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes of an incomplete trailing UTF-8 sequence
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_TOKENIZER_H_
