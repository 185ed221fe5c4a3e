#include "verifier_service/drafter_directory.h"

#include <algorithm>

namespace treespec {

bool DrafterDirectory::Heard(const DrafterDescription& drafter, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  // Forget the ones past the ttl here too, so a pool of restarting drafters stays bounded.
  absl::erase_if(drafters_, [&](const auto& entry) { return now - entry.second.heard > ttl_; });
  auto [it, inserted] = drafters_.try_emplace(drafter.id, Entry{drafter, now});
  if (inserted) return true;
  Entry& known = it->second;
  const bool changed = known.drafter.spec.defaults != drafter.spec.defaults ||
                       known.drafter.spec.max != drafter.spec.max ||
                       known.drafter.kinds != drafter.kinds ||
                       known.drafter.default_kind != drafter.default_kind ||
                       known.drafter.feature_needs != drafter.feature_needs;
  known = Entry{drafter, now};
  return changed;
}

DrafterPoolInfo DrafterDirectory::Pool(absl::Time now) const {
  DrafterPoolInfo pool;
  bool defaults_agree = true;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, entry] : drafters_) {
    if (now - entry.heard > ttl_) continue;
    const std::optional<DrafterKind>& default_kind = entry.drafter.default_kind;
    if (pool.drafters == 0) {
      pool.default_kind = default_kind;
    } else if (pool.default_kind != default_kind) {
      defaults_agree = false;
    }
    ++pool.drafters;
    pool.max = MaxSpecLimits(pool.max, entry.drafter.spec.max);
    pool.kinds.insert(pool.kinds.end(), entry.drafter.kinds.begin(), entry.drafter.kinds.end());
    for (const auto& needs : entry.drafter.feature_needs) {
      if (std::find(pool.feature_needs.begin(), pool.feature_needs.end(), needs) ==
          pool.feature_needs.end()) {
        pool.feature_needs.push_back(needs);
      }
    }
  }
  if (!defaults_agree) pool.default_kind.reset();
  std::sort(pool.kinds.begin(), pool.kinds.end());
  pool.kinds.erase(std::unique(pool.kinds.begin(), pool.kinds.end()), pool.kinds.end());
  return pool;
}

}  // namespace treespec
