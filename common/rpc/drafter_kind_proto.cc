#include "common/rpc/drafter_kind_proto.h"

namespace treespec {

v1::SpeculationMode ToProto(DrafterKind kind) {
  switch (kind) {
    case DrafterKind::kNgram:
      return v1::SPECULATION_MODE_NGRAM;
    case DrafterKind::kDraftModel:
      return v1::SPECULATION_MODE_DRAFT_MODEL;
    case DrafterKind::kDflash:
      return v1::SPECULATION_MODE_DFLASH;
    case DrafterKind::kReplay:
      return v1::SPECULATION_MODE_REPLAY;
  }
  return v1::SPECULATION_MODE_AUTO;
}

std::optional<DrafterKind> DrafterKindFromProto(int mode) {
  for (const DrafterKindInfo& info : AllDrafterKinds()) {
    if (ToProto(info.kind) == mode) return info.kind;
  }
  return std::nullopt;
}

}  // namespace treespec
