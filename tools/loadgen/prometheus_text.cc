#include "tools/loadgen/prometheus_text.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace treespec::loadgen {
namespace {

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool IsNameChar(char c) { return IsNameStart(c) || absl::ascii_isdigit(c); }

// Consumes a metric or label name from the front of `s`; "" when there is none.
std::string TakeName(absl::string_view& s) {
  size_t n = 0;
  if (!s.empty() && IsNameStart(s[0])) {
    while (n < s.size() && IsNameChar(s[n])) ++n;
  }
  std::string name(s.substr(0, n));
  s.remove_prefix(n);
  return name;
}

// "+Inf", "-Inf", "NaN" or a decimal / exponent number.
bool ParseValue(absl::string_view word, double* value) {
  if (word == "+Inf" || word == "Inf") {
    *value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (word == "-Inf") {
    *value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (word == "NaN") {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return absl::SimpleAtod(word, value) && std::isfinite(*value);
}

// Consumes `{name="value",...}` from the front of `s` into `labels`; an error message or "".
std::string TakeLabels(absl::string_view& s, std::map<std::string, std::string>& labels) {
  s.remove_prefix(1);  // '{'
  while (true) {
    s = absl::StripLeadingAsciiWhitespace(s);
    if (absl::ConsumePrefix(&s, "}")) return "";
    const std::string name = TakeName(s);
    if (name.empty()) return "expected a label name or '}'";
    s = absl::StripLeadingAsciiWhitespace(s);
    if (!absl::ConsumePrefix(&s, "=")) return absl::StrCat("expected '=' after label ", name);
    s = absl::StripLeadingAsciiWhitespace(s);
    if (!absl::ConsumePrefix(&s, "\"")) return absl::StrCat("label ", name, ": expected '\"'");
    std::string value;
    bool closed = false;
    while (!s.empty()) {
      const char c = s[0];
      s.remove_prefix(1);
      if (c == '"') {
        closed = true;
        break;
      }
      if (c != '\\') {
        value += c;
        continue;
      }
      if (s.empty()) break;
      const char e = s[0];
      s.remove_prefix(1);
      if (e == 'n') {
        value += '\n';
      } else if (e == '\\' || e == '"') {
        value += e;
      } else {
        return absl::StrCat("label ", name, ": unknown escape \\", std::string(1, e));
      }
    }
    if (!closed) return absl::StrCat("label ", name, ": unterminated value");
    if (!labels.emplace(name, std::move(value)).second) {
      return absl::StrCat("label ", name, " given twice");
    }
    s = absl::StripLeadingAsciiWhitespace(s);
    if (absl::ConsumePrefix(&s, ",")) continue;
    if (absl::ConsumePrefix(&s, "}")) return "";
    return absl::StrCat("expected ',' or '}' after label ", name);
  }
}

}  // namespace

absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(absl::string_view text) {
  std::vector<MetricSample> samples;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", line_number, " (", line, "): ", what));
    };
    MetricSample sample;
    absl::string_view rest = line;
    sample.name = TakeName(rest);
    if (sample.name.empty()) return error("expected a metric name");
    if (!rest.empty() && rest[0] == '{') {
      const std::string message = TakeLabels(rest, sample.labels);
      if (!message.empty()) return error(message);
    }
    const std::vector<absl::string_view> words =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty() || words.size() > 2) return error("expected a value and an optional time");
    if (!ParseValue(words[0], &sample.value)) {
      return error(absl::StrCat("value '", words[0], "' is not a number"));
    }
    int64_t timestamp_ms;
    if (words.size() == 2 && !absl::SimpleAtoi(words[1], &timestamp_ms)) {
      return error(absl::StrCat("timestamp '", words[1], "' is not an integer"));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

SampleSum SumSamples(absl::Span<const MetricSample> samples, absl::string_view name,
                     const std::map<std::string, std::string>& match) {
  SampleSum out;
  for (const MetricSample& s : samples) {
    if (s.name != name) continue;
    bool matches = true;
    for (const auto& [key, value] : match) {
      const auto it = s.labels.find(key);
      matches = matches && it != s.labels.end() && it->second == value;
    }
    if (!matches) continue;
    out.sum += s.value;
    ++out.count;
  }
  return out;
}

}  // namespace treespec::loadgen
