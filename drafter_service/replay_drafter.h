// A drafter for measurement, never a default (issue 34): it proposes the target's own greedy
// continuation, recorded from a plain run (treespec-loadgen --record_tokens), with each
// proposed token replaced by a random one at a set rate. A random-weight target of a real
// model's shape then gets a controlled acceptance, so speculation can be measured where the
// verify step costs what it costs on such a model (the tiny pair's ~0.2 ms step is shorter
// than any drafter's round trip).
//
// Acceptance: with replace rate r a chain drafted from position p is accepted up to the first
// replaced position, so a chain of depth D gives a mean acceptance length
// τ = (1 - q^(D+1)) / (1 - q), q = 1 - r (r = 0.5, D = 8: τ ≈ 2; r = 0.25, D = 8: 3.7;
// r = 0.15, D = 16: 6.2; r = 0.1, D = 32: 9.7). With width k > 1 each depth along the path has
// k candidates, the first of them that is not replaced being the recorded token (each child is
// "replaced" independently, so a depth survives with 1 - r^k): a tree whose siblings hold the
// chance a real drafter's alternatives would. Whether a position's candidate is replaced is a
// pure function of (seed, record, position, child), so every setting of a benchmark sees the
// same replacements. Each node's log-probability is what it truly has under this model:
// log((1 - r) r^j) for the j-th child.
//
// A session's context must start with a record (prompt + recorded output); a session whose
// prompt matches none, or whose context leaves its record (the target chose differently, as
// sampling or a near-tie can make it), drafts nothing from then on.
#ifndef TREESPEC_DRAFTER_SERVICE_REPLAY_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_REPLAY_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "drafter_service/drafter.h"

namespace treespec {

struct ReplayOptions {
  double replace_rate = 0.25;  // chance that a proposed candidate is replaced, in [0, 1]
  int width = 1;               // candidates per depth: 1 = chains
  uint64_t seed = 0;
};

// Checks the option ranges; the message names the flag.
absl::Status ValidateReplayOptions(const ReplayOptions& options);

// Recorded token sequences (prompt + greedy output), sorted so that the one a context starts
// with is found by binary search.
class ReplayRecords {
 public:
  // From the JSON lines treespec-loadgen --record_tokens writes: {"prompt_ids": [...],
  // "output_ids": [...]} per request. Errors name the file and line.
  static absl::StatusOr<ReplayRecords> Load(const std::string& path);
  explicit ReplayRecords(std::vector<std::vector<int32_t>> sequences);

  // Index of a record that starts with `prefix`, or -1.
  int Find(absl::Span<const int32_t> prefix) const;
  const std::vector<int32_t>& record(int index) const { return records_[index]; }
  int size() const { return static_cast<int>(records_.size()); }
  // One past the largest token recorded: replacements are drawn from [0, this).
  int32_t vocab_bound() const { return vocab_bound_; }

 private:
  std::vector<std::vector<int32_t>> records_;
  int32_t vocab_bound_ = 0;
};

class ReplayDrafterFactory final : public DrafterFactory {
 public:
  ReplayDrafterFactory(std::shared_ptr<const ReplayRecords> records, const ReplayOptions& options)
      : records_(std::move(records)), options_(options) {}
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;

 private:
  const std::shared_ptr<const ReplayRecords> records_;
  const ReplayOptions options_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_REPLAY_DRAFTER_H_
