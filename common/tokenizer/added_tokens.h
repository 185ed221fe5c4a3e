// Added tokens (special like "<|endoftext|>" and ordinary ones) are cut out of the text before
// pre-tokenization, as Hugging Face's AddedVocabulary does: leftmost-longest matching over all
// token contents, then each token's single_word / lstrip / rstrip rules.
#ifndef TREESPEC_COMMON_TOKENIZER_ADDED_TOKENS_H_
#define TREESPEC_COMMON_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace treespec {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  // match only where no word character touches either end
  bool lstrip = false;       // the match swallows White_Space before it
  bool rstrip = false;       // the match swallows White_Space after it
  bool normalized = false;   // matched in the normalized text (else in the raw text)
  bool special = false;      // only informative here: decoding always includes the content
};

// A piece of text: either an added token (token_id >= 0) or plain text to pre-tokenize.
struct TextSegment {
  size_t begin = 0;  // byte offsets into the text that was split
  size_t end = 0;
  int32_t token_id = -1;
};

// Finds a set of added tokens in text. Immutable after construction, so thread-safe.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for (the token's content, normalized for normalized tokens);
  // `tokens[i]` says which token it is.
  AddedTokenMatcher(const std::vector<std::string>& patterns,
                    const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }

  // Splits valid UTF-8 `text` into segments covering it in order (empty text: no segments).
  // Matching follows Hugging Face: at the leftmost position where some content matches, take
  // the longest; a single_word token touching a word character is dropped there and scanning
  // resumes after it; lstrip extends the match left over White_Space not already consumed,
  // rstrip extends it right. Scanning resumes after the (extended) match.
  void Split(std::string_view text, std::vector<TextSegment>* segments) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node index), sorted by byte
    int32_t token = -1;                                 // index into tokens_, or -1
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  // Index into tokens_ of the longest content starting at text[pos] and its length, or -1.
  int32_t LongestMatchAt(std::string_view text, size_t pos, size_t* length) const;

  std::vector<Node> nodes_;  // a trie of the patterns; nodes_[0] is the root
  // Whether some pattern starts with the byte: most text positions are rejected by this alone.
  std::array<bool, 256> starts_pattern_{};
  std::vector<AddedToken> tokens_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_ADDED_TOKENS_H_
