// What a tokenizer is built from, whatever file described it: tokenizer.json (tokenizer.cc) or
// a tiktoken model (tiktoken.cc). Internal to treespec_tokenizer.
#ifndef TREESPEC_COMMON_TOKENIZER_TOKENIZER_SPEC_H_
#define TREESPEC_COMMON_TOKENIZER_TOKENIZER_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace treespec {

// Cuts the text into chunks encoded independently before anything else (added tokens
// included), as tokenizer code around tiktoken does to bound its work: every chunk_chars
// characters, then wherever a run of whitespace (Python's str.isspace) or of non-whitespace
// grows past max_run_chars characters. 0 = no such cut.
struct TextChunking {
  size_t chunk_chars = 0;
  size_t max_run_chars = 0;
};

struct TokenizerSpec {
  absl::flat_hash_map<std::string, int32_t> vocab;  // token string (byte-level spelling) -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  BpeOptions bpe_options;
  std::string unk_token;  // "" for none
  std::vector<AddedToken> added_tokens;
  bool nfc = false;
  std::vector<PreTokenizerStep> pre_tokenizer;
  TextChunking chunking;
};

// The tokenizer `spec` describes; `origin` names its source in errors (a merge that uses a
// token missing from the vocabulary is INVALID_ARGUMENT).
absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(TokenizerSpec spec,
                                                          std::string_view origin);

// `text` (valid UTF-8) cut by `chunking`; no chunks for empty text. Exposed for tests.
std::vector<std::string_view> SplitIntoChunks(std::string_view text, const TextChunking& chunking);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_TOKENIZER_SPEC_H_
