// The drafters one drafter process serves, one factory per kind: the service opens sessions
// through it and states its kinds from it, so a new kind is its factory plus one Add.
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFTER_REGISTRY_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFTER_REGISTRY_H_

#include <map>
#include <memory>
#include <vector>

#include "common/tree/drafter_kind.h"
#include "drafter_service/drafter.h"

namespace treespec {

class DrafterRegistry {
 public:
  // Serves `kind` with `factory` (thread-safe: sessions are opened from several threads),
  // replacing an earlier one of the kind.
  void Add(DrafterKind kind, std::unique_ptr<DrafterFactory> factory);
  // Null when this process does not serve `kind`.
  DrafterFactory* Find(DrafterKind kind) const;
  // The kinds served, in enum order.
  std::vector<DrafterKind> kinds() const;

 private:
  std::map<DrafterKind, std::unique_ptr<DrafterFactory>> factories_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFTER_REGISTRY_H_
