// Pre-tokenization: cutting plain text into the pieces BPE merges within (a merge never crosses
// a piece boundary). Supports what byte-level BPE tokenizers use: ByteLevel (GPT-2: optional
// prefix space + the GPT-2 regex) and Sequence[Split(regex)..., ByteLevel(use_regex=false)]
// (Llama 3, Qwen2). Pieces stay raw bytes; the byte-level character mapping is folded into the
// BPE vocabulary (see bpe.h), which is equivalent and saves a rewrite of every piece.
#ifndef TREESPEC_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define TREESPEC_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"

namespace treespec {

// GPT-2's pre-tokenizer regex, which ByteLevel(use_regex=true) applies.
inline constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// What happens to the matches of a Split (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior {
  kRemoved,             // matches are dropped
  kIsolated,            // matches become pieces of their own
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // consecutive matches join into one piece
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kByteLevel;
  // kSplit: what to match; `regex` is null for a literal {"String": ...} pattern.
  std::unique_ptr<Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // the matches are the text between the pattern's matches
  // kByteLevel.
  bool add_prefix_space = false;  // prepend ' ' to every piece not starting with one
  bool use_regex = true;          // split with kGpt2Pattern (`regex` holds it)
};

class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Appends the pieces of valid UTF-8 `text` (never empty pieces). Thread-safe.
  absl::Status Split(std::string_view text, std::vector<std::string>* pieces) const;

 private:
  // One step over one piece; appends to `out`.
  absl::Status ApplyStep(const PreTokenizerStep& step, std::string_view piece,
                         std::vector<std::string>* out) const;

  std::vector<PreTokenizerStep> steps_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_TOKENIZER_PRE_TOKENIZER_H_
