#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace treespec::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char;
  // Every mapped character is below U+0144 (256 + 68).
  static constexpr char32_t kCharLimit = 0x144;
  std::array<int16_t, kCharLimit> char_to_byte;  // -1: not a byte character
};

bool IsPrintable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr Tables MakeTables() {
  Tables t{};
  for (auto& v : t.char_to_byte) v = -1;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = IsPrintable(b) ? static_cast<char32_t>(b) : next++;
    t.byte_to_char[b] = c;
    t.char_to_byte[c] = static_cast<int16_t>(b);
  }
  return t;
}

const Tables& GetTables() {
  static const Tables tables = MakeTables();
  return tables;
}

}  // namespace

char32_t ByteToChar(uint8_t b) { return GetTables().byte_to_char[b]; }

std::optional<uint8_t> CharToByte(char32_t c) {
  if (c >= Tables::kCharLimit) return std::nullopt;
  const int16_t b = GetTables().char_to_byte[c];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::string Encode(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char ch : bytes) utf8::AppendCodePoint(t.byte_to_char[static_cast<uint8_t>(ch)], &out);
  return out;
}

std::optional<std::string> Decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Step step = utf8::Decode(text, pos);
    if (step.kind != utf8::StepKind::kValid) return std::nullopt;
    const std::optional<uint8_t> b = CharToByte(step.code_point);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += step.length;
  }
  return out;
}

}  // namespace treespec::byte_level
