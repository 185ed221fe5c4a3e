// UTF-8 helpers the tokenizer needs: strict validation (Unicode Table 3-7: no overlongs, no
// surrogates, nothing above U+10FFFF), code point iteration, and lossy conversion that replaces
// ill-formed bytes with U+FFFD one "maximal subpart" at a time (Unicode 15 §3.9, the rule
// Rust's String::from_utf8_lossy and so Hugging Face's decoders follow).
#ifndef TREESPEC_COMMON_TOKENIZER_UTF8_H_
#define TREESPEC_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace treespec::utf8 {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

enum class StepKind {
  kValid,       // a whole well-formed character
  kIncomplete,  // a proper prefix of a well-formed character cut off by the end of the input
  kInvalid,     // bytes that can never start a well-formed character here
};

struct Step {
  StepKind kind;
  // kValid: the character's length (1-4). kIncomplete: the bytes present (1-3).
  // kInvalid: the length of the maximal subpart to replace with one U+FFFD (>= 1).
  int length;
  char32_t code_point;  // only for kValid
};

// Classifies the sequence starting at s[pos]; requires pos < s.size().
Step Decode(std::string_view s, size_t pos);

// Offset of the first byte of the first ill-formed (or truncated) sequence, or npos when all of
// `s` is valid UTF-8.
size_t FindInvalid(std::string_view s);

// Length of the longest prefix of `s` that does not end inside a character that the next bytes
// could still complete: s.size() minus the bytes of a trailing incomplete character (0-3).
size_t CompletePrefixLength(std::string_view s);

// Appends `s` to `out` as valid UTF-8, replacing each maximal ill-formed subpart with U+FFFD.
// When `at_end` is false an incomplete character at the very end is not consumed, so that more
// bytes may complete it; returns the number of bytes of `s` consumed.
size_t AppendLossy(std::string_view s, bool at_end, std::string* out);

// AppendLossy over all of `s`, as Rust's from_utf8_lossy.
std::string ToValidLossy(std::string_view s);

// Appends the UTF-8 encoding of a scalar value (< 0x110000, not a surrogate).
void AppendCodePoint(char32_t cp, std::string* out);

}  // namespace treespec::utf8

#endif  // TREESPEC_COMMON_TOKENIZER_UTF8_H_
