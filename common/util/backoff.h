// Exponential backoff with jitter for reconnecting to a peer that failed: each delay is the
// previous one times `multiplier`, capped at `max`, then spread by ±`jitter` so that many
// clients that lost the same peer at once do not retry in lockstep.
#ifndef TREESPEC_COMMON_UTIL_BACKOFF_H_
#define TREESPEC_COMMON_UTIL_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace treespec {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);  // the first delay, before jitter
  absl::Duration max = absl::Seconds(5);             // no delay exceeds this, before jitter
  double multiplier = 2.0;                           // >= 1
  double jitter = 0.2;                               // [0, 1): delays vary by ±jitter
};

// The message names the field; Backoff assumes options that pass.
absl::Status ValidateBackoffOptions(const BackoffOptions& options);

// Not thread-safe: one owner (e.g. one reconnecting stream).
class Backoff {
 public:
  explicit Backoff(BackoffOptions options, uint64_t seed = std::random_device()());

  // The delay before the next attempt; each call (without a Reset) grows the next one.
  absl::Duration NextDelay();
  // An attempt succeeded: the next delay starts again from `initial`.
  void Reset() { base_ = options_.initial; }

 private:
  BackoffOptions options_;
  absl::Duration base_;  // the next delay before jitter
  std::mt19937_64 rng_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_BACKOFF_H_
