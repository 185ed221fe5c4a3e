// A DraftContext on the wire: DraftCommit's tokens and its packed target features.
#ifndef TREESPEC_COMMON_RPC_DRAFT_CONTEXT_PROTO_H_
#define TREESPEC_COMMON_RPC_DRAFT_CONTEXT_PROTO_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tree/draft_context.h"
#include "common/tree/drafter_kind.h"
#include "treespec/v1/drafter.pb.h"

namespace treespec {

// Fills `out`'s tokens and features (bf16 little-endian), leaving its step alone.
void ToProto(const DraftContext& context, v1::DraftCommit* out);

// A commit's feature rows travel in parts of at most this many bytes, so that every message
// stays well under a drafter's --max_message_bytes (keep that at 2 MiB or more for drafters
// that read features; the default is 4 MiB).
inline constexpr size_t kFeaturePartBytes = size_t{1} << 20;

// Commit `step` as the messages that carry it: its feature rows in parts of at most
// `max_feature_bytes` (at least one row each), every part but the last marked `more` and
// carrying no tokens, the last one carrying the tokens. One message when the rows fit.
std::vector<v1::DraftRequest> CommitParts(int64_t step, const DraftContext& context,
                                          size_t max_feature_bytes = kFeaturePartBytes);

// The commit's context; InvalidArgument naming the field (after `what`, e.g. "commit step 3")
// when the features are not feature_rows whole rows of finite bf16. Token ids are the
// caller's to check.
absl::StatusOr<DraftContext> DraftContextFromProto(const v1::DraftCommit& commit,
                                                   absl::string_view what);

// A kind's feature needs (DrafterInfo.feature_needs), both ways.
void ToProto(DrafterKind kind, const FeatureSpec& needs, v1::FeatureNeeds* out);
FeatureSpec FromProto(const v1::FeatureNeeds& needs);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_DRAFT_CONTEXT_PROTO_H_
