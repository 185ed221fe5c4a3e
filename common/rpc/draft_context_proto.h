// A DraftContext on the wire: DraftCommit's tokens and its packed target features.
#ifndef TREESPEC_COMMON_RPC_DRAFT_CONTEXT_PROTO_H_
#define TREESPEC_COMMON_RPC_DRAFT_CONTEXT_PROTO_H_

#include "absl/status/statusor.h"
#include "common/tree/draft_context.h"
#include "common/tree/drafter_kind.h"
#include "treespec/v1/drafter.pb.h"

namespace treespec {

// Fills `out`'s tokens and features (bf16 little-endian), leaving its step alone.
void ToProto(const DraftContext& context, v1::DraftCommit* out);

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
