#include "common/tokenizer/pre_tokenizer.h"

#include <utility>

#include "common/util/status_macros.h"

namespace treespec {
namespace {

struct Span {
  size_t begin;
  size_t end;
  bool flag;  // is_match before the behavior fold, "remove" after it
};

// Matches of a literal, left to right, non-overlapping (Hugging Face escapes it into a regex).
std::vector<MatchSpan> FindLiteral(std::string_view text, std::string_view literal) {
  std::vector<MatchSpan> matches;
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    matches.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return matches;
}

// The matches and the gaps between them, covering `size` bytes in order.
std::vector<Span> MatchesAndGaps(const std::vector<MatchSpan>& matches, size_t size) {
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  }
  if (prev != size) spans.push_back({prev, size, false});
  return spans;
}

// Hugging Face's NormalizedString::split fold: turns (span, is_match) into (span, remove).
std::vector<Span> ApplyBehavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (Span& s : spans) s.flag = false;
      return spans;
    case SplitBehavior::kRemoved:
      return spans;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      return std::vector<Span>(out.rbegin(), out.rend());
  }
  return spans;
}

}  // namespace

absl::Status PreTokenizer::ApplyStep(const PreTokenizerStep& step, std::string_view piece,
                                     std::vector<std::string>* out) const {
  std::string prefixed;
  const Regex* regex = step.regex.get();
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (!step.use_regex) {
      out->emplace_back(piece);
      return absl::OkStatus();
    }
  }
  std::vector<MatchSpan> matches;
  if (regex != nullptr) {
    RETURN_IF_ERROR(regex->FindAll(piece, &matches));
  } else {
    matches = FindLiteral(piece, step.literal);
  }
  std::vector<Span> spans = MatchesAndGaps(matches, piece.size());
  if (step.invert) {
    for (Span& s : spans) s.flag = !s.flag;
  }
  const SplitBehavior behavior =
      step.kind == PreTokenizerStep::Kind::kByteLevel ? SplitBehavior::kIsolated : step.behavior;
  for (const Span& s : ApplyBehavior(std::move(spans), behavior)) {
    if (!s.flag && s.end > s.begin) out->emplace_back(piece.substr(s.begin, s.end - s.begin));
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::Split(std::string_view text, std::vector<std::string>* pieces) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (const std::string& piece : current) RETURN_IF_ERROR(ApplyStep(step, piece, &next));
    current.swap(next);
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
  return absl::OkStatus();
}

}  // namespace treespec
