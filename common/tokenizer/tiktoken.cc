#include "common/tokenizer/tiktoken.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/regex.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

// This Abseil's string_view is its own type, not std::string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The index just past the `]` closing the class that opens at `open` ('['), or npos.
size_t ClassEnd(std::string_view p, size_t open) {
  size_t i = open + 1;
  if (i < p.size() && p[i] == '^') ++i;
  if (i < p.size() && p[i] == ']') ++i;  // a leading ']' is a literal
  int depth = 1;
  while (i < p.size()) {
    if (p[i] == '\\') {
      i += 2;
      continue;
    }
    if (p[i] == '[') ++depth;
    if (p[i] == ']' && --depth == 0) return i + 1;
    ++i;
  }
  return std::string_view::npos;
}

// The offset of a `&&` at the top level of class content `c`, or npos.
size_t TopLevelIntersection(std::string_view c) {
  int depth = 0;
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    if (c[i] == '\\') {
      ++i;
    } else if (c[i] == '[') {
      ++depth;
    } else if (c[i] == ']') {
      --depth;
    } else if (depth == 0 && c[i] == '&' && c[i + 1] == '&') {
      return i;
    }
  }
  return std::string_view::npos;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return text.str();
}

}  // namespace

std::string TiktokenToPcre2Pattern(std::string_view p) {
  std::string out;
  for (size_t i = 0; i < p.size();) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      out.append(p.substr(i, 2));
      i += 2;
      continue;
    }
    const size_t end = p[i] == '[' ? ClassEnd(p, i) : std::string_view::npos;
    if (end == std::string_view::npos) {
      out.push_back(p[i++]);
      continue;
    }
    const std::string_view content = p.substr(i + 1, end - i - 2);
    const size_t amp = TopLevelIntersection(content);
    if (amp == std::string_view::npos) {
      out.append(p.substr(i, end - i));
    } else {
      const std::string_view right = content.substr(amp + 2);
      const bool bracketed =
          !right.empty() && right.front() == '[' && ClassEnd(right, 0) == right.size();
      const std::string right_class =
          bracketed ? std::string(right) : absl::StrCat("[", Absl(right), "]");
      absl::StrAppend(&out, "(?:(?=", TiktokenToPcre2Pattern(right_class), ")",
                      TiktokenToPcre2Pattern(absl::StrCat("[", Absl(content.substr(0, amp)), "]")),
                      ")");
    }
    i = end;
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, int32_t>>> ParseTiktokenRanks(
    std::string_view text, std::string_view origin) {
  std::vector<std::pair<std::string, int32_t>> ranks;
  absl::flat_hash_map<std::string, int> token_line;
  absl::flat_hash_map<int32_t, int> rank_line;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(Absl(text), '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    std::string token;
    int32_t rank = -1;
    if (fields.size() != 2 || !absl::Base64Unescape(fields[0], &token) ||
        !absl::SimpleAtoi(fields[1], &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: expected \"<base64 token> <rank >= 0>\", got \"%s\"",
                          std::string(origin), line_number, std::string(line.substr(0, 80))));
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: an empty token", std::string(origin), line_number));
    }
    if (auto [it, fresh] = token_line.emplace(token, line_number); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: token %s was given on line %d already", std::string(origin),
                          line_number, std::string(fields[0]), it->second));
    }
    if (auto [it, fresh] = rank_line.emplace(rank, line_number); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: rank %d was given on line %d already", std::string(origin),
                          line_number, rank, it->second));
    }
    ranks.emplace_back(std::move(token), rank);
  }
  return ranks;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTiktokenTokenizer(
    const std::vector<std::pair<std::string, int32_t>>& ranks, TiktokenOptions options,
    std::string_view origin) {
  absl::flat_hash_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(ranks.size());
  for (const auto& [bytes, rank] : ranks) rank_of.emplace(bytes, rank);
  for (int b = 0; b < 256; ++b) {
    if (!rank_of.contains(std::string_view(std::string(1, static_cast<char>(b))))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: byte 0x%02X is not a token (a tiktoken model must hold all 256 bytes)",
          std::string(origin), b));
    }
  }
  TokenizerSpec spec;
  spec.vocab.reserve(ranks.size());
  // One merge per way to split a token into two tokens, ordered by the token's rank (then by
  // the parts' ranks, as Transformers' TikTokenConverter orders them).
  std::vector<std::tuple<int32_t, int32_t, int32_t, std::string_view, std::string_view>> merges;
  for (const auto& [bytes, rank] : ranks) {
    spec.vocab.emplace(byte_level::Encode(bytes), rank);
    const std::string_view token = bytes;
    for (size_t k = 1; k < token.size(); ++k) {
      const auto left = rank_of.find(token.substr(0, k));
      const auto right = rank_of.find(token.substr(k));
      if (left != rank_of.end() && right != rank_of.end()) {
        merges.emplace_back(rank, left->second, right->second, left->first, right->first);
      }
    }
  }
  std::sort(merges.begin(), merges.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  spec.merges.reserve(merges.size());
  for (const auto& m : merges) {
    spec.merges.emplace_back(byte_level::Encode(std::get<3>(m)),
                             byte_level::Encode(std::get<4>(m)));
  }
  spec.bpe_options.ignore_merges = true;  // a piece that is a token is that token
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  ASSIGN_OR_RETURN(split.regex, Regex::Compile(TiktokenToPcre2Pattern(options.pattern)));
  // tiktoken encodes the regex's matches and nothing between them.
  split.behavior = SplitBehavior::kRemoved;
  split.invert = true;
  spec.pre_tokenizer.push_back(std::move(split));
  spec.added_tokens = std::move(options.special);
  spec.chunking = options.chunking;
  return BuildTokenizer(std::move(spec), origin);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadKimiTokenizer(const std::string& dir) {
  const std::string model_path = dir + "/tiktoken.model";
  ASSIGN_OR_RETURN(const std::string model_text, ReadFile(model_path));
  ASSIGN_OR_RETURN(auto ranks, ParseTiktokenRanks(model_text, model_path));
  const int32_t base = static_cast<int32_t>(ranks.size());
  for (const auto& [bytes, rank] : ranks) {
    if (rank >= base) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: rank %d is not below the %d tokens (the special tokens follow them)",
                          model_path, rank, base));
    }
  }
  // Special tokens: ids [base, base + 258), named by tokenizer_config.json where it names them.
  constexpr int kSpecial = 256 + 2;
  absl::flat_hash_map<int32_t, std::string> names;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (absl::StatusOr<std::string> config = ReadFile(config_path); config.ok()) {
    const nlohmann::json root = nlohmann::json::parse(*config, nullptr, false);
    if (root.is_discarded() || !root.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    if (auto it = root.find("added_tokens_decoder"); it != root.end() && it->is_object()) {
      for (const auto& [key, entry] : it->items()) {
        int32_t id = -1;
        if (!absl::SimpleAtoi(key, &id) || !entry.is_object() || !entry.contains("content") ||
            !entry["content"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(config_path, ": added_tokens_decoder[\"",
                                                         key, "\"] is not {\"content\": ...}"));
        }
        names[id] = entry["content"].get<std::string>();
      }
    }
  }
  TiktokenOptions options;
  options.pattern = std::string(kKimiPattern);
  options.chunking = {400000, 25000};
  for (int32_t id = base; id < base + kSpecial; ++id) {
    AddedToken t;
    t.id = id;
    const auto it = names.find(id);
    t.content = it != names.end() ? it->second : absl::StrCat("<|reserved_token_", id, "|>");
    t.special = true;
    options.special.push_back(std::move(t));
  }
  return BuildTiktokenTokenizer(ranks, std::move(options), model_path);
}

}  // namespace treespec
