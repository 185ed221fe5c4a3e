#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "absl/strings/str_cat.h"

namespace treespec {
namespace {

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* p) const { pcre2_match_context_free(p); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* p) const { pcre2_jit_stack_free(p); }
};

// Length of the UTF-8 character starting at s[pos] (s is valid UTF-8).
size_t CharLength(std::string_view s, size_t pos) {
  const auto b = static_cast<uint8_t>(s[pos]);
  if (b < 0x80) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// The JIT's default stack (32 KiB) suffices for tokenizer patterns on ordinary text; a pattern
// that needs more gets one retry with this much.
constexpr size_t kLargeJitStackBytes = 8 << 20;

}  // namespace

std::string OnigurumaToPcre2Pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  bool class_start = false;  // just after "[" or "[^", where "]" is a literal
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (next == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        // `\S` inside a class has no simple rewrite; it stays PCRE2's (differs only at U+0085).
        out += c;
        out += next;
      }
      class_start = false;
      continue;
    }
    out += c;
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        class_start = true;
        if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      }
      continue;
    }
    if (c == ']' && !class_start) {
      in_class = false;
    } else if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // A POSIX class such as [:alpha:]: copy it whole so its "]" does not end the class.
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i + 1, close + 2 - (i + 1)));
        i = close + 1;
      }
    }
    class_start = false;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string adapted = OnigurumaToPcre2Pattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UTF: subjects and patterns are UTF-8. UCP: \s, \d, \w and POSIX classes use Unicode
  // properties, as Oniguruma's do. MULTILINE: Oniguruma's ^ and $ always match at line breaks.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(adapted.data()), adapted.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", std::string(pattern), "\" does not compile (PCRE2, at offset ",
                     error_offset, " of \"", adapted, "\"): ", Pcre2ErrorMessage(error_code)));
  }
  // Without JIT (an unsupported platform) the interpreter gives the same matches, slower.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(std::string_view subject, std::vector<MatchSpan>* matches) const {
  matches->clear();
  const auto* code = static_cast<const pcre2_code*>(code_);
  // Match data is per call: pcre2_match writes into it, so it cannot be shared across threads.
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create_from_pattern(code, nullptr));
  if (match_data == nullptr) return absl::ResourceExhaustedError("PCRE2 match data allocation");
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;
  // PCRE2 10.42 rejects a null subject even when it is empty.
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.empty() ? "" : subject.data());

  size_t search_from = 0;
  std::optional<size_t> last_match_end;
  while (search_from <= subject.size()) {
    // The caller validated the UTF-8, and search_from is always at a character boundary.
    const int rc = pcre2_match(code, data, subject.size(), search_from, PCRE2_NO_UTF_CHECK,
                               match_data.get(), context.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      context.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(32 << 10, kLargeJitStackBytes, nullptr));
      if (context == nullptr || jit_stack == nullptr) {
        return absl::ResourceExhaustedError("PCRE2 JIT stack allocation");
      }
      pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
      continue;
    }
    if (rc < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("regex \"", pattern_, "\" failed at byte ",
                                                       search_from, ": ", Pcre2ErrorMessage(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && last_match_end == end) {
      if (search_from >= subject.size()) break;
      search_from += CharLength(subject, search_from);
      continue;
    }
    matches->emplace_back(start, end);
    search_from = end;
    last_match_end = end;
  }
  return absl::OkStatus();
}

}  // namespace treespec
