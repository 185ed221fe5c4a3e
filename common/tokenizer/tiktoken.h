// tiktoken BPE models ("<base64 token> <rank>" per line, as tiktoken's load_tiktoken_bpe reads
// them) and the Kimi-K2 tokenizer built on one (its tiktoken.model, the special tokens of its
// tokenizer_config.json, the pre-tokenizer regex and text chunking of its tokenization_kimi.py).
//
// A tiktoken model is a byte-level BPE whose merge priority is the rank of the merged token:
// encoding a piece takes the piece itself when it is a token, else repeatedly merges the
// adjacent pair whose concatenation has the lowest rank (leftmost on ties). That is the BPE of
// tokenizer.json with ignore_merges and one merge (left, right) per way of splitting each token
// into two tokens, ranked by the token's rank — Transformers' TikTokenConverter writes the same
// — so it is built as one (tokenizer_spec.h) and shares the encode/decode pipeline.
#ifndef TREESPEC_COMMON_TOKENIZER_TIKTOKEN_H_
#define TREESPEC_COMMON_TOKENIZER_TIKTOKEN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_spec.h"

namespace treespec {

// Kimi-K2's pre-tokenizer (tokenization_kimi.py's pat_str; Rust regex syntax, with character
// class intersection `&&`): Han runs apart from other letters, case-aware word pieces with
// English contractions, digits in threes, punctuation runs, newlines and spaces.
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// Rewrites Rust-regex character class intersections, which PCRE2 lacks: `[A&&B]` becomes
// `(?:(?=B')[A])`, B' being B as a class (`[B]` unless B is one already). One character
// matches both classes exactly when the lookahead of the second holds where the first
// consumes it. Other syntax passes through. Exposed for tests.
std::string TiktokenToPcre2Pattern(std::string_view pattern);

// The (token bytes, rank) lines of a tiktoken model; INVALID_ARGUMENT naming `origin` and the
// line for bad base64, a missing or negative rank, or a token or rank given twice.
absl::StatusOr<std::vector<std::pair<std::string, int32_t>>> ParseTiktokenRanks(
    std::string_view text, std::string_view origin);

struct TiktokenOptions {
  std::string pattern;              // pre-tokenizer regex, tiktoken (Rust regex) syntax
  std::vector<AddedToken> special;  // matched in the text before anything else
  TextChunking chunking;
};

// A tokenizer for `ranks`; every single byte must be a token (tiktoken's merging starts from
// bytes), else INVALID_ARGUMENT naming the byte.
absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTiktokenTokenizer(
    const std::vector<std::pair<std::string, int32_t>>& ranks, TiktokenOptions options,
    std::string_view origin);

// Kimi-K2's tokenizer from `dir`: tiktoken.model, and the special tokens' names from the
// added_tokens_decoder of tokenizer_config.json — ids [n, n + 258) after the n ranks, unnamed
// ones "<|reserved_token_{id}|>" — matched anywhere in the text, with its pattern and its
// chunking (400,000 characters; runs of 25,000).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadKimiTokenizer(const std::string& dir);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_TIKTOKEN_H_
