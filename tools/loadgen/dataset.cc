#include "tools/loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace treespec::loadgen {

LengthRange RandomLengthRange(int len, double range_ratio) {
  // vLLM's bounds: int(len · (1 - r)) and int(len · (1 + r)), both inclusive.
  const int lo = static_cast<int>(static_cast<double>(len) * (1.0 - range_ratio));
  const int hi = static_cast<int>(static_cast<double>(len) * (1.0 + range_ratio));
  return {std::max(1, lo), std::max(1, hi)};
}

absl::StatusOr<std::vector<Prompt>> RandomDataset(const RandomDatasetOptions& options) {
  if (options.num_prompts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of prompts ", options.num_prompts, ": must be >= 1"));
  }
  if (options.input_len < 1 || options.output_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("random input length ", options.input_len,
                                                   " and output length ", options.output_len,
                                                   ": both must be >= 1"));
  }
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("random range ratio ", options.range_ratio, ": must be in [0, 1)"));
  }
  if (options.vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab size ", options.vocab_size, ": must be >= 1"));
  }
  std::mt19937_64 rng(options.seed);
  const LengthRange in = RandomLengthRange(options.input_len, options.range_ratio);
  const LengthRange out = RandomLengthRange(options.output_len, options.range_ratio);
  std::uniform_int_distribution<int> input_len(in.min, in.max);
  std::uniform_int_distribution<int> output_len(out.min, out.max);
  std::uniform_int_distribution<int32_t> token(0, options.vocab_size - 1);
  std::vector<Prompt> prompts(options.num_prompts);
  for (Prompt& p : prompts) {
    p.token_ids.resize(input_len(rng));
    for (int32_t& id : p.token_ids) id = token(rng);
    p.output_len = output_len(rng);
  }
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> ParseJsonlPrompts(absl::string_view contents,
                                                      absl::string_view name, int output_len) {
  if (output_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("output length ", output_len, ": must be >= 1"));
  }
  std::vector<Prompt> prompts;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ":", line_number, ": not a JSON object"));
    }
    const auto text = j.find("text");
    if (text == j.end() || !text->is_string() || text->get_ref<const std::string&>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":", line_number, ": expected a non-empty \"text\" string (the prompt)"));
    }
    prompts.push_back({.text = text->get<std::string>(), .output_len = output_len});
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name,
                                                   ": no prompts (one JSON object with a "
                                                   "\"text\" string per line)"));
  }
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> LoadJsonlDataset(const std::string& path, int num_prompts,
                                                     int output_len) {
  if (num_prompts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of prompts ", num_prompts, ": must be >= 1"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the dataset ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<std::vector<Prompt>> file = ParseJsonlPrompts(contents.str(), path, output_len);
  if (!file.ok()) return file.status();
  std::vector<Prompt> prompts;
  prompts.reserve(num_prompts);
  for (int i = 0; i < num_prompts; ++i) prompts.push_back((*file)[i % file->size()]);
  return prompts;
}

}  // namespace treespec::loadgen
