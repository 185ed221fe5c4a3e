// The DeepSeek-V3 router (MoeConfig): which experts a row goes to and with what weights,
// exactly as Transformers' DeepseekV3TopkRouter computes them, in fp32.
#ifndef TREESPEC_COMMON_MODEL_MOE_ROUTER_H_
#define TREESPEC_COMMON_MODEL_MOE_ROUTER_H_

#include <vector>

#include "absl/types/span.h"
#include "common/model/config.h"

namespace treespec {

struct ExpertChoice {
  int expert = 0;
  float weight = 0.0f;
};

// Reusable buffers of RouteRow.
struct RouterScratch {
  std::vector<float> scores;  // [E] sigmoid(logits)
  std::vector<float> choice;  // [E] scores + bias, 0 outside the kept groups
  std::vector<float> group;   // [n_group] sum of each group's top 2 choice scores
  std::vector<int> order;     // [max(E, n_group)] indices being ranked
  std::vector<char> kept;     // [n_group] 1 for the kept groups
};

// Routes one row: `logits` [E] = x · W_gateᵀ, `bias` [E] = e_score_correction_bias; writes
// experts_per_token choices to `out`, in increasing expert order (the order Transformers adds
// the experts' outputs in). As Transformers computes it:
//   s = sigmoid(logits); c = s + bias;
//   group score = the sum of the group's two largest c; keep the topk_group best groups;
//   c of experts outside the kept groups := 0.0 (not -inf: with negative biases such an expert
//   can still win a slot, as it does in Transformers);
//   experts = the experts_per_token largest c;
//   weight = s[e] (unbiased), / (Σ chosen s + 1e-20) when norm_topk_prob, × routed_scaling_factor.
// Equal scores rank the lower index first (torch.topk leaves ties to its implementation).
void RouteRow(const MoeConfig& config, const float* logits, const float* bias,
              RouterScratch& scratch, absl::Span<ExpertChoice> out);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_MOE_ROUTER_H_
