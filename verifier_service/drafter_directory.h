// What a verifier knows of the drafters behind its --drafter target: each drafter's stated
// limits and kinds, by drafter id, from Drafter.GetInfo and from every session's DraftOpened.
// The pool's limits are the largest any drafter heard from lately serves: a request above them
// is refused at admission (Engine::ValidateSpeculation); a session that lands on a smaller
// drafter runs at that drafter's maxima (it clamps, and its DraftOpened says so).
#ifndef TREESPEC_VERIFIER_SERVICE_DRAFTER_DIRECTORY_H_
#define TREESPEC_VERIFIER_SERVICE_DRAFTER_DIRECTORY_H_

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/tree/spec_limits.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/request.h"

namespace treespec {

// One drafter's statement (v1::DrafterInfo as domain types).
struct DrafterDescription {
  std::string id;                           // the drafter process; a restart is a new id
  SpecBounds spec;                          // its defaults and maxima
  std::vector<DrafterKind> kinds;           // kinds it serves, sorted
  std::optional<DrafterKind> default_kind;  // what AUTO gets (DrafterInfo.default_mode)
  // What its kinds that read target features need (DrafterInfo.feature_needs).
  std::vector<std::pair<DrafterKind, FeatureSpec>> feature_needs;
};

// Thread-safe.
class DrafterDirectory {
 public:
  // A drafter not heard from for `ttl` (no GetInfo answer, no session opened on it) is
  // forgotten: it left the pool, or restarted under a new id.
  explicit DrafterDirectory(absl::Duration ttl) : ttl_(ttl) {}

  // Records a statement heard at `now`. True when it is news (a drafter not known, or one
  // whose limits or kinds changed), so the caller can log it once.
  bool Heard(const DrafterDescription& drafter, absl::Time now);

  // The pool as known at `now`: drafters heard from within the ttl, the largest of their
  // maxima, the union of their kinds.
  DrafterPoolInfo Pool(absl::Time now) const;

 private:
  struct Entry {
    DrafterDescription drafter;
    absl::Time heard;
  };
  const absl::Duration ttl_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> drafters_;  // by id; guarded by mu_
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_DRAFTER_DIRECTORY_H_
