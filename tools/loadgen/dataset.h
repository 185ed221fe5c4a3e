// What a load test sends (issue 4): prompts with the number of tokens to generate for each.
//   - random: token-id prompts drawn uniformly from [0, vocab), input and output lengths drawn
//     uniformly from [len · (1 - range_ratio), len · (1 + range_ratio)] as vLLM's random
//     dataset does (`--random-range-ratio`), seeded;
//   - JSONL: one JSON object per line with a "text" string (the format of
//     tests/data/heldout_prompts.jsonl; other keys are ignored), used in file order and
//     repeated from the top when more prompts are asked for than the file holds.
#ifndef TREESPEC_TOOLS_LOADGEN_DATASET_H_
#define TREESPEC_TOOLS_LOADGEN_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace treespec::loadgen {

struct Prompt {
  std::string text;                // a text prompt (JSONL), or
  std::vector<int32_t> token_ids;  // a token-id prompt (random); exactly one is non-empty
  int output_len = 0;              // max_new_tokens, >= 1
  // Set by the workloads that shape requests (conversation.h, mixed_load.h), reported apart:
  // the conversation a turn belongs to (-1: none) and the turn's number from 1, the tokens of
  // the prompt that repeat the conversation so far (the previous prompt and answer, all but
  // the answer's last token, whose K/V a server computed), and a class of request ("stream",
  // "long_prompt"; empty: none).
  int conversation = -1;
  int turn = 0;
  int reusable_tokens = 0;
  std::string group;
};

struct RandomDatasetOptions {
  int num_prompts = 0;
  int input_len = 0;         // mean prompt tokens, >= 1
  int output_len = 0;        // mean tokens to generate, >= 1
  double range_ratio = 0.0;  // in [0, 1): lengths spread ± this share around the mean
  int vocab_size = 0;        // token ids are drawn from [0, vocab_size)
  uint64_t seed = 0;
};

// The shortest and longest length that `len` with `range_ratio` can draw (never below 1).
struct LengthRange {
  int min = 0, max = 0;
};
LengthRange RandomLengthRange(int len, double range_ratio);

// InvalidArgument naming the field for counts or lengths < 1, a ratio outside [0, 1) or a vocab
// size < 1.
absl::StatusOr<std::vector<Prompt>> RandomDataset(const RandomDatasetOptions& options);

// Prompts of `contents` (JSONL; `name` labels errors, e.g. the path), each with `output_len`.
// InvalidArgument naming the line for a line that is not a JSON object with a "text" string,
// or for a file without prompts. Blank lines are skipped.
absl::StatusOr<std::vector<Prompt>> ParseJsonlPrompts(absl::string_view contents,
                                                      absl::string_view name, int output_len);

// `num_prompts` prompts from the JSONL file at `path` (repeated in order when it holds fewer).
// NotFound when the file cannot be read; the errors of ParseJsonlPrompts otherwise.
absl::StatusOr<std::vector<Prompt>> LoadJsonlDataset(const std::string& path, int num_prompts,
                                                     int output_len);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_DATASET_H_
