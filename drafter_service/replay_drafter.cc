#include "drafter_service/replay_drafter.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"
#include "common/util/mix64.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

// One splitmix64 step: advance by the golden increment, then mix.
uint64_t Step64(uint64_t x) { return Mix64(x + kGolden64); }

// A uniform 64-bit value keyed by (seed, record, position, child, what).
uint64_t Draw(uint64_t seed, int record, int64_t position, int child, int what) {
  uint64_t h = Step64(seed);
  for (const uint64_t v : {static_cast<uint64_t>(record), static_cast<uint64_t>(position),
                           static_cast<uint64_t>(child), static_cast<uint64_t>(what)}) {
    h = Step64(h ^ v);
  }
  return h;
}

double Uniform(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

absl::StatusOr<std::vector<int32_t>> TokenArray(const nlohmann::json& line, const char* field,
                                                const std::string& where) {
  const auto it = line.find(field);
  if (it == line.end() || !it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", field, "\" is missing or not an array of token ids"));
  }
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (const nlohmann::json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", field, "\" holds ", v.dump(), ", not a token id"));
    }
    out.push_back(v.get<int32_t>());
  }
  return out;
}

class ReplayDraftSession final : public DraftSession {
 public:
  ReplayDraftSession(std::shared_ptr<const ReplayRecords> records, const ReplayOptions& options)
      : records_(std::move(records)), options_(options) {}

  absl::Status Append(const DraftContext& added) override {
    const absl::Span<const int32_t> tokens = added.tokens;
    if (!opened_) {
      opened_ = true;
      record_ = records_->Find(tokens);
      length_ = static_cast<int64_t>(tokens.size());
      if (record_ < 0) {
        TS_LOG(kInfo, "replay: no record starts with this %d-token prompt", tokens.size());
      }
      return absl::OkStatus();
    }
    if (record_ >= 0) {
      const std::vector<int32_t>& rec = records_->record(record_);
      const int64_t end = length_ + static_cast<int64_t>(tokens.size());
      if (end > static_cast<int64_t>(rec.size()) ||
          !std::equal(tokens.begin(), tokens.end(), rec.begin() + length_)) {
        // The target chose otherwise than when it was recorded: nothing more to replay.
        TS_LOG(kInfo, "replay: a session left its record (%d) at token %d of %d", record_,
               static_cast<int>(length_), static_cast<int>(rec.size()));
        record_ = -1;
      }
    }
    length_ += static_cast<int64_t>(tokens.size());
    return absl::OkStatus();
  }

  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override {
    DraftedTree tree;
    if (record_ < 0 || limits.tree_budget <= 0 || limits.max_depth <= 0) return tree;
    const std::vector<int32_t>& rec = records_->record(record_);
    const int32_t vocab = records_->vocab_bound();
    int width = std::min(options_.width, limits.tree_budget);
    if (limits.top_k > 0) width = std::min(width, limits.top_k);
    const int64_t left = static_cast<int64_t>(rec.size()) - length_;
    const int depth =
        static_cast<int>(std::min<int64_t>({limits.max_depth, limits.tree_budget / width, left}));
    if (vocab < 2) return tree;  // no token to replace one with
    const double r = options_.replace_rate;
    int parent = -1;
    for (int d = 0; d < depth; ++d) {
      const int64_t position = length_ + d;  // the record's token there is the true one
      const int32_t truth = rec[position];
      int next_parent = -1;
      for (int j = 0; j < width; ++j) {
        const bool keep =
            next_parent < 0 && Uniform(Draw(options_.seed, record_, position, j, 0)) >= r;
        int32_t token = truth;
        if (!keep) {
          // A uniform token other than the true one.
          token = static_cast<int32_t>(Draw(options_.seed, record_, position, j, 1) %
                                       static_cast<uint64_t>(vocab - 1));
          if (token >= truth) ++token;
        }
        if (keep) next_parent = static_cast<int>(tree.tokens.size());
        tree.tokens.push_back(token);
        tree.parents.push_back(parent);
        // P(child j is the true token | the ones before it are not) · P(those are not).
        tree.logprobs.push_back(
            static_cast<float>(std::max(std::log1p(-r) + j * std::log(std::max(r, 1e-30)), -1e4)));
      }
      // The path goes on under the true token; where every candidate was replaced, under the
      // first (its descendants can never be accepted, as with a real drafter's miss).
      parent = next_parent >= 0 ? next_parent : static_cast<int>(tree.tokens.size()) - width;
    }
    return tree;
  }

 private:
  const std::shared_ptr<const ReplayRecords> records_;
  const ReplayOptions options_;
  bool opened_ = false;
  int record_ = -1;     // the record the context follows; -1: none
  int64_t length_ = 0;  // context tokens appended
};

}  // namespace

absl::Status ValidateReplayOptions(const ReplayOptions& o) {
  if (!(o.replace_rate >= 0 && o.replace_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replay_replace_rate must be in [0, 1] (got ", o.replace_rate, ")"));
  }
  if (o.width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replay_width must be >= 1 (got ", o.width, "); 1 = chains"));
  }
  return absl::OkStatus();
}

ReplayRecords::ReplayRecords(std::vector<std::vector<int32_t>> sequences)
    : records_(std::move(sequences)) {
  std::sort(records_.begin(), records_.end());
  for (const std::vector<int32_t>& r : records_) {
    for (int32_t t : r) vocab_bound_ = std::max(vocab_bound_, t + 1);
  }
}

absl::StatusOr<ReplayRecords> ReplayRecords::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path,
                     ": cannot open the replay record (write one with treespec-loadgen "
                     "--record_tokens)"));
  }
  std::vector<std::vector<int32_t>> sequences;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    absl::StatusOr<std::vector<int32_t>> prompt = TokenArray(j, "prompt_ids", where);
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<std::vector<int32_t>> output = TokenArray(j, "output_ids", where);
    if (!output.ok()) return output.status();
    if (prompt->empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty prompt"));
    prompt->insert(prompt->end(), output->begin(), output->end());
    sequences.push_back(*std::move(prompt));
  }
  if (sequences.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds no record"));
  }
  return ReplayRecords(std::move(sequences));
}

int ReplayRecords::Find(absl::Span<const int32_t> prefix) const {
  const auto it = std::lower_bound(
      records_.begin(), records_.end(), prefix, [](const std::vector<int32_t>& r, auto p) {
        return std::lexicographical_compare(r.begin(), r.end(), p.begin(), p.end());
      });
  if (it == records_.end() || it->size() < prefix.size() ||
      !std::equal(prefix.begin(), prefix.end(), it->begin())) {
    return -1;
  }
  return static_cast<int>(it - records_.begin());
}

absl::StatusOr<std::unique_ptr<DraftSession>> ReplayDrafterFactory::NewSession() {
  return std::unique_ptr<DraftSession>(std::make_unique<ReplayDraftSession>(records_, options_));
}

}  // namespace treespec
