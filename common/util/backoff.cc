#include "common/util/backoff.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace treespec {

absl::Status ValidateBackoffOptions(const BackoffOptions& o) {
  if (o.initial <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("backoff initial delay must be > 0 (got ",
                                                   absl::FormatDuration(o.initial), ")"));
  }
  if (o.max < o.initial) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff max delay (", absl::FormatDuration(o.max),
                     ") must be >= the initial delay (", absl::FormatDuration(o.initial), ")"));
  }
  if (!(o.multiplier >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff multiplier must be >= 1 (got ", o.multiplier, ")"));
  }
  if (!(o.jitter >= 0.0 && o.jitter < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff jitter must be in [0, 1) (got ", o.jitter, ")"));
  }
  return absl::OkStatus();
}

Backoff::Backoff(BackoffOptions options, uint64_t seed)
    : options_(options), base_(options.initial), rng_(seed) {}

absl::Duration Backoff::NextDelay() {
  const absl::Duration base = base_;
  base_ = std::min(options_.max, base_ * options_.multiplier);
  std::uniform_real_distribution<double> spread(1.0 - options_.jitter, 1.0 + options_.jitter);
  return base * spread(rng_);
}

}  // namespace treespec
