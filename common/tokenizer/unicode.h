// Unicode facts the tokenizer needs beyond UTF-8 coding, from ICU: NFC normalization (Qwen2's
// tokenizer.json asks for it) and the character classes Hugging Face's added-token matching uses
// (Rust regex `\s` = White_Space, `\w` = Alphabetic | Mark | Nd | Pc | Join_Control).
#ifndef TREESPEC_COMMON_TOKENIZER_UNICODE_H_
#define TREESPEC_COMMON_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace treespec::unicode {

// NFC of valid UTF-8 text.
absl::StatusOr<std::string> NormalizeNfc(std::string_view text);

bool IsWhiteSpace(char32_t c);
bool IsWordChar(char32_t c);

// Byte length of the run of White_Space characters at the start of valid UTF-8 `s`.
size_t LeadingWhiteSpaceLength(std::string_view s);
// Byte length of the run of White_Space characters at the end of valid UTF-8 `s`.
size_t TrailingWhiteSpaceLength(std::string_view s);
// Whether valid UTF-8 `s` starts (ends) with a word character.
bool StartsWithWordChar(std::string_view s);
bool EndsWithWordChar(std::string_view s);

}  // namespace treespec::unicode

#endif  // TREESPEC_COMMON_TOKENIZER_UNICODE_H_
