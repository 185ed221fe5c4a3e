// GPT-2's reversible byte <-> character map ("bytes_to_unicode"): byte-level BPE vocabularies
// spell every byte as one printable character, so that vocab and merges are plain strings.
// Printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) map to themselves; the other 68 bytes map,
// in byte order, to U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
#ifndef TREESPEC_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define TREESPEC_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace treespec::byte_level {

// The character byte `b` is spelled as.
char32_t ByteToChar(uint8_t b);

// The byte character `c` spells, or nullopt for characters outside the map.
std::optional<uint8_t> CharToByte(char32_t c);

// Raw bytes -> their byte-level spelling (UTF-8 of the mapped characters).
std::string Encode(std::string_view bytes);

// Byte-level spelling -> raw bytes; nullopt when `text` is not valid UTF-8 or holds a character
// outside the map (such strings cannot come out of Encode, e.g. added tokens like "<s> x").
std::optional<std::string> Decode(std::string_view text);

}  // namespace treespec::byte_level

#endif  // TREESPEC_COMMON_TOKENIZER_BYTE_LEVEL_H_
