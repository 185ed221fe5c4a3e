#include "common/tree/drafter_kind.h"

#include "absl/strings/str_join.h"

namespace treespec {
namespace {

constexpr DrafterKindInfo kKinds[] = {
    {DrafterKind::kNgram, "ngram", "NGRAM", ""},
    {DrafterKind::kDraftModel, "draft_model", "DRAFT_MODEL", "--draft_model=DIR"},
    {DrafterKind::kDflash, "dflash", "DFLASH", "--dflash=DIR --dflash_target=DIR"},
    {DrafterKind::kReplay, "replay", "REPLAY", "--replay=FILE"},
};

std::string Join(absl::Span<const DrafterKind> kinds, const char* DrafterKindInfo::*field) {
  return absl::StrJoin(kinds, ", ", [field](std::string* out, DrafterKind kind) {
    out->append(InfoOf(kind).*field);
  });
}

static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == kNumDrafterKinds);

}  // namespace

absl::Span<const DrafterKindInfo> AllDrafterKinds() { return kKinds; }

const DrafterKindInfo& InfoOf(DrafterKind kind) { return kKinds[static_cast<int>(kind)]; }

const char* DrafterKindName(DrafterKind kind) { return InfoOf(kind).name; }

std::optional<DrafterKind> DrafterKindFromName(absl::string_view name) {
  for (const DrafterKindInfo& info : kKinds) {
    if (name == info.name) return info.kind;
  }
  return std::nullopt;
}

std::string DrafterKindNames(absl::Span<const DrafterKind> kinds) {
  return Join(kinds, &DrafterKindInfo::name);
}

std::string DrafterModeNames(absl::Span<const DrafterKind> kinds) {
  return Join(kinds, &DrafterKindInfo::mode_name);
}

}  // namespace treespec
