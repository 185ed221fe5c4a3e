// The pre-tokenizer regexes of tokenizer.json files (GPT-2's, Llama 3's, Qwen2's, ...) run with
// PCRE2 in UTF + UCP mode (JIT-compiled where the platform allows). Hugging Face runs them with
// Oniguruma; both are backtracking engines with the same leftmost-first alternation, and the few
// syntax differences that matter for these patterns are bridged in Regex::Compile.
#ifndef TREESPEC_COMMON_TOKENIZER_REGEX_H_
#define TREESPEC_COMMON_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace treespec {

// [start, end) byte offsets of one match.
using MatchSpan = std::pair<size_t, size_t>;

class Regex {
 public:
  // INVALID_ARGUMENT naming the offset in `pattern` when it does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All matches in `subject` (valid UTF-8), left to right and non-overlapping, as the Rust onig
  // crate's find_iter yields them (Hugging Face's Split and ByteLevel use it): an empty match
  // right where the previous match ended is skipped by advancing one character. Thread-safe.
  absl::Status FindAll(std::string_view subject, std::vector<MatchSpan>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;  // as written in tokenizer.json
  void* code_;           // pcre2_code_8*, kept opaque so users need no PCRE2 headers
};

// Rewrites Oniguruma's `\s` (the White_Space property, which includes U+0085) for PCRE2, whose
// UCP `\s` is Z* plus ASCII spaces and so misses U+0085. Exposed for tests.
std::string OnigurumaToPcre2Pattern(std::string_view pattern);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_REGEX_H_
