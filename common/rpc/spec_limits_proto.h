// The Drafter API's SpecLimits message as the domain type and back: the one conversion both
// services use (the verifier reads drafters' statements, the drafter writes them).
#ifndef TREESPEC_COMMON_RPC_SPEC_LIMITS_PROTO_H_
#define TREESPEC_COMMON_RPC_SPEC_LIMITS_PROTO_H_

#include "common/tree/spec_limits.h"
#include "treespec/v1/drafter.pb.h"

namespace treespec {

SpecLimits FromProto(const v1::SpecLimits& proto);
void ToProto(const SpecLimits& limits, v1::SpecLimits* proto);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_SPEC_LIMITS_PROTO_H_
