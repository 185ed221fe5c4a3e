#include "common/tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utypes.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace treespec::unicode {
namespace {

// The last character of valid UTF-8 `s` (non-empty) and where it starts.
char32_t LastChar(std::string_view s, size_t* start) {
  size_t pos = s.size() - 1;
  while (pos > 0 && (static_cast<uint8_t>(s[pos]) & 0xC0) == 0x80) --pos;
  *start = pos;
  return utf8::Decode(s, pos).code_point;
}

}  // namespace

absl::StatusOr<std::string> NormalizeNfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) {
    return absl::InternalError(
        absl::StrCat("ICU NFC normalizer unavailable: ", u_errorName(status)));
  }
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  // Most text is already NFC; the check is much cheaper than a rewrite.
  if (nfc->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU NFC normalization failed: ", u_errorName(status)));
  }
  return out;
}

bool IsWhiteSpace(char32_t c) { return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE); }

bool IsWordChar(char32_t c) {
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

size_t LeadingWhiteSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const utf8::Step step = utf8::Decode(s, pos);
    if (step.kind != utf8::StepKind::kValid || !IsWhiteSpace(step.code_point)) break;
    pos += step.length;
  }
  return pos;
}

size_t TrailingWhiteSpaceLength(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start;
    if (!IsWhiteSpace(LastChar(s.substr(0, end), &start))) break;
    end = start;
  }
  return s.size() - end;
}

bool StartsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  const utf8::Step step = utf8::Decode(s, 0);
  return step.kind == utf8::StepKind::kValid && IsWordChar(step.code_point);
}

bool EndsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t start;
  return IsWordChar(LastChar(s, &start));
}

}  // namespace treespec::unicode
