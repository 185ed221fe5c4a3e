#include "common/tokenizer/added_tokens.h"

#include <algorithm>

#include "common/tokenizer/unicode.h"

namespace treespec {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<std::string>& patterns,
                                     const std::vector<AddedToken>& tokens)
    : nodes_(1), tokens_(tokens) {
  for (size_t t = 0; t < patterns.size(); ++t) {
    if (patterns[t].empty()) continue;  // Hugging Face ignores empty contents too
    starts_pattern_[static_cast<uint8_t>(patterns[t][0])] = true;
    int32_t node = 0;
    for (const char ch : patterns[t]) {
      const auto byte = static_cast<uint8_t>(ch);
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0})),
            {byte, child});
      }
      node = child;
    }
    // Two tokens with one pattern: the first keeps it (the loader rejects duplicate contents).
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  const auto it =
      std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

int32_t AddedTokenMatcher::LongestMatchAt(std::string_view text, size_t pos, size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<TextSegment>* segments) const {
  size_t consumed = 0;  // text before this is already in segments
  size_t pos = 0;       // where the scan for the next match resumes
  while (pos < text.size()) {
    if (!starts_pattern_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int32_t t = LongestMatchAt(text, pos, &length);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[t];
    size_t start = pos;
    size_t stop = pos + length;
    if (token.single_word && (unicode::EndsWithWordChar(text.substr(0, start)) ||
                              unicode::StartsWithWordChar(text.substr(stop)))) {
      pos = stop;
      continue;
    }
    if (token.lstrip) {
      start -= unicode::TrailingWhiteSpaceLength(text.substr(consumed, start - consumed));
    }
    if (token.rstrip) stop += unicode::LeadingWhiteSpaceLength(text.substr(stop));
    if (consumed < start) segments->push_back({consumed, start, -1});
    segments->push_back({start, stop, token.id});
    consumed = stop;
    pos = stop;
  }
  if (consumed < text.size()) segments->push_back({consumed, text.size(), -1});
}

}  // namespace treespec
