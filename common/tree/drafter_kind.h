// The kinds of drafter: one list both services use (the wire's SpeculationMode names a kind, a
// drafter states which it serves, a request may ask for one). A new kind is a row here, its
// proto value in common/rpc/drafter_kind_proto.cc and its factory registered in the drafter.
#ifndef TREESPEC_COMMON_TREE_DRAFTER_KIND_H_
#define TREESPEC_COMMON_TREE_DRAFTER_KIND_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace treespec {

// kReplay is for measurement only (drafter_service/replay_drafter.h): never a default.
enum class DrafterKind { kNgram, kDraftModel, kDflash, kReplay };
inline constexpr int kNumDrafterKinds = 4;

struct DrafterKindInfo {
  DrafterKind kind;
  const char* name;       // in flags and logs: "ngram", "draft_model", "dflash", "replay"
  const char* mode_name;  // its SpeculationMode without the prefix: "NGRAM", ...
  // What a drafter needs to serve it, for the messages that refuse the kind: "" = always served.
  const char* needs;
};

// Every kind, in enum order.
absl::Span<const DrafterKindInfo> AllDrafterKinds();
const DrafterKindInfo& InfoOf(DrafterKind kind);
const char* DrafterKindName(DrafterKind kind);
// By DrafterKindInfo::name; nullopt for anything else.
std::optional<DrafterKind> DrafterKindFromName(absl::string_view name);
// "ngram, draft_model" (names) or "NGRAM, DRAFT_MODEL" (mode names) of `kinds`.
std::string DrafterKindNames(absl::Span<const DrafterKind> kinds);
std::string DrafterModeNames(absl::Span<const DrafterKind> kinds);

}  // namespace treespec

#endif  // TREESPEC_COMMON_TREE_DRAFTER_KIND_H_
