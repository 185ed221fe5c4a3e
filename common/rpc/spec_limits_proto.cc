#include "common/rpc/spec_limits_proto.h"

namespace treespec {

SpecLimits FromProto(const v1::SpecLimits& proto) {
  return SpecLimits{proto.tree_budget(), proto.max_depth(), proto.top_k()};
}

void ToProto(const SpecLimits& limits, v1::SpecLimits* proto) {
  proto->set_tree_budget(limits.tree_budget);
  proto->set_max_depth(limits.max_depth);
  proto->set_top_k(limits.top_k);
}

}  // namespace treespec
