#include "common/model/moe_router.h"

#include <algorithm>
#include <cmath>

namespace treespec {
namespace {

// The `k` indices of `values` with the largest values (ties: lower index first), in `order`'s
// first k places.
void TopK(absl::Span<const float> values, int k, std::vector<int>& order) {
  order.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) order[i] = static_cast<int>(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
}

}  // namespace

void RouteRow(const MoeConfig& c, const float* logits, const float* bias, RouterScratch& s,
              absl::Span<ExpertChoice> out) {
  const int experts = c.num_experts, groups = c.num_groups, per_group = experts / groups;
  s.scores.resize(experts);
  s.choice.resize(experts);
  for (int e = 0; e < experts; ++e) {
    s.scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    s.choice[e] = s.scores[e] + bias[e];
  }
  s.group.resize(groups);
  for (int g = 0; g < groups; ++g) {
    const float* begin = s.choice.data() + g * per_group;
    float first = -INFINITY, second = -INFINITY;
    for (int i = 0; i < per_group; ++i) {
      if (begin[i] > first) {
        second = first;
        first = begin[i];
      } else if (begin[i] > second) {
        second = begin[i];
      }
    }
    s.group[g] = first + second;
  }
  if (c.topk_groups < groups) {
    TopK(s.group, c.topk_groups, s.order);
    s.kept.assign(groups, 0);
    for (int i = 0; i < c.topk_groups; ++i) s.kept[s.order[i]] = 1;
    for (int e = 0; e < experts; ++e) {
      if (!s.kept[e / per_group]) s.choice[e] = 0.0f;
    }
  }
  const int k = c.experts_per_token;
  TopK(s.choice, k, s.order);
  std::sort(s.order.begin(), s.order.begin() + k);
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) sum += s.scores[s.order[i]];
  const float denominator = c.norm_topk_prob ? sum + 1e-20f : 1.0f;
  for (int i = 0; i < k; ++i) {
    const int e = s.order[i];
    const float w = c.norm_topk_prob ? s.scores[e] / denominator : s.scores[e];
    out[i] = {e, w * c.routed_scaling_factor};
  }
}

}  // namespace treespec
