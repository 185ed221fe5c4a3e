#include "common/tokenizer/byte_level.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace treespec::byte_level {
namespace {

TEST(ByteLevelTest, KnownCharacters) {
  EXPECT_EQ(ByteToChar('!'), U'!');
  EXPECT_EQ(ByteToChar('~'), U'~');
  EXPECT_EQ(ByteToChar(0xA1), U'\u00A1');
  EXPECT_EQ(ByteToChar(0xFF), U'\u00FF');
  // Non-printable bytes count up from U+0100 in byte order: 0..32, 127..160, 173.
  EXPECT_EQ(ByteToChar(0x00), U'\u0100');
  EXPECT_EQ(ByteToChar('\n'), U'\u010A');  // "Ċ"
  EXPECT_EQ(ByteToChar(' '), U'\u0120');   // "Ġ"
  EXPECT_EQ(ByteToChar(0x7F), U'\u0121');
  EXPECT_EQ(ByteToChar(0xA0), U'\u0142');
  EXPECT_EQ(ByteToChar(0xAD), U'\u0143');
}

TEST(ByteLevelTest, IsABijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = ByteToChar(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(c).second) << b;
    ASSERT_TRUE(CharToByte(c).has_value()) << b;
    EXPECT_EQ(*CharToByte(c), b);
  }
  EXPECT_FALSE(CharToByte(U' ').has_value());
  EXPECT_FALSE(CharToByte(U'\u0144').has_value());
  EXPECT_FALSE(CharToByte(U'\U0001F600').has_value());
}

TEST(ByteLevelTest, EncodeDecodeStrings) {
  EXPECT_EQ(Encode(" hello\n"), "\xC4\xA0hello\xC4\x8A");  // "Ġhello" + "Ċ"
  EXPECT_EQ(Decode("\xC4\xA0hello\xC4\x8A"), " hello\n");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(Decode(Encode(all)), all);
  EXPECT_FALSE(Decode("<s> x").has_value());  // ' ' is not a byte character
  EXPECT_FALSE(Decode("\xFF").has_value());   // not UTF-8
}

}  // namespace
}  // namespace treespec::byte_level
