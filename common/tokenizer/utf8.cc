#include "common/tokenizer/utf8.h"

#include <cstdint>

namespace treespec::utf8 {
namespace {

// Number of bytes in the character a lead byte starts, or 0 for bytes that never lead
// (continuations 80..BF, C0/C1 which could only start overlongs, F5..FF beyond U+10FFFF).
int SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// Allowed range of the second byte; Table 3-7 narrows it for E0 (no overlongs), ED (no
// surrogates), F0 (no overlongs) and F4 (nothing above U+10FFFF). Later bytes are 80..BF.
void SecondByteRange(uint8_t lead, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead == 0xE0) *lo = 0xA0;
  if (lead == 0xED) *hi = 0x9F;
  if (lead == 0xF0) *lo = 0x90;
  if (lead == 0xF4) *hi = 0x8F;
}

}  // namespace

Step Decode(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t lead = p[0];
  const int n = SequenceLength(lead);
  if (n == 1) return {StepKind::kValid, 1, lead};
  if (n == 0) return {StepKind::kInvalid, 1, 0};
  uint8_t lo, hi;
  SecondByteRange(lead, &lo, &hi);
  char32_t cp = lead & (0xFF >> (n + 1));
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= avail) return {StepKind::kIncomplete, i, 0};
    const uint8_t b = p[i];
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    // The maximal subpart ends before the first byte that cannot continue the sequence.
    if (b < min || b > max) return {StepKind::kInvalid, i, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {StepKind::kValid, n, cp};
}

size_t FindInvalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path: most text the tokenizer sees is code or English.
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Step step = Decode(s, pos);
    if (step.kind != StepKind::kValid) return pos;
    pos += step.length;
  }
  return std::string_view::npos;
}

size_t CompletePrefixLength(std::string_view s) {
  // A trailing incomplete character starts at a lead byte among the last 3 bytes.
  const size_t first = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t pos = s.size(); pos > first; --pos) {
    const uint8_t b = static_cast<uint8_t>(s[pos - 1]);
    if (b >= 0x80 && b < 0xC0) continue;  // a continuation byte: keep looking for its lead
    const Step step = Decode(s, pos - 1);
    return step.kind == StepKind::kIncomplete ? pos - 1 : s.size();
  }
  return s.size();
}

size_t AppendLossy(std::string_view s, bool at_end, std::string* out) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Step step = Decode(s, pos);
    switch (step.kind) {
      case StepKind::kValid:
        out->append(s.data() + pos, step.length);
        break;
      case StepKind::kIncomplete:
        if (!at_end) return pos;
        out->append(kReplacementUtf8);
        break;
      case StepKind::kInvalid:
        out->append(kReplacementUtf8);
        break;
    }
    pos += step.length;
  }
  return pos;
}

std::string ToValidLossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  AppendLossy(s, /*at_end=*/true, &out);
  return out;
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace treespec::utf8
