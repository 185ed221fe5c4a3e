#include "drafter_service/drafter_registry.h"

#include <utility>

namespace treespec {

void DrafterRegistry::Add(DrafterKind kind, std::unique_ptr<DrafterFactory> factory) {
  factories_[kind] = std::move(factory);
}

DrafterFactory* DrafterRegistry::Find(DrafterKind kind) const {
  const auto it = factories_.find(kind);
  return it == factories_.end() ? nullptr : it->second.get();
}

std::vector<DrafterKind> DrafterRegistry::kinds() const {
  std::vector<DrafterKind> out;
  for (const auto& [kind, factory] : factories_) {
    if (factory != nullptr) out.push_back(kind);
  }
  return out;
}

}  // namespace treespec
