// Drafter kinds on the wire: a SpeculationMode names a kind, except AUTO and OFF.
#ifndef TREESPEC_COMMON_RPC_DRAFTER_KIND_PROTO_H_
#define TREESPEC_COMMON_RPC_DRAFTER_KIND_PROTO_H_

#include <optional>

#include "common/tree/drafter_kind.h"
#include "treespec/v1/generation.pb.h"

namespace treespec {

v1::SpeculationMode ToProto(DrafterKind kind);
// The kind `mode` names; nullopt for AUTO, OFF and values this build does not know.
std::optional<DrafterKind> DrafterKindFromProto(int mode);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_DRAFTER_KIND_PROTO_H_
