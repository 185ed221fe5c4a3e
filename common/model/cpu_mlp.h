// The CPU forward's MLP blocks (MlpKind) on one tensor-parallel rank: the dense gated MLP and
// the DeepSeek-V3 mixture of experts. Each writes this rank's part of the block's output; the
// caller all-reduces. Row-wise like every CPU op (cpu_ops.h): a row's output depends only on
// that row, never on the batch.
#ifndef TREESPEC_COMMON_MODEL_CPU_MLP_H_
#define TREESPEC_COMMON_MODEL_CPU_MLP_H_

#include <utility>
#include <vector>

#include "common/model/config.h"
#include "common/model/moe_router.h"
#include "common/model/tp_plan.h"
#include "common/model/weights.h"

namespace treespec {

// Reusable buffers (no allocation once the largest batch has been seen).
struct MlpScratch {
  std::vector<float> gate;            // [rows, width]
  std::vector<float> up;              // [rows, width]
  std::vector<float> logits;          // [M, E] router logits
  std::vector<ExpertChoice> choices;  // [M, experts_per_token]
  // [E] the rows routed to each expert (ascending) with their weights
  std::vector<std::vector<std::pair<int, float>>> routed;
  std::vector<float> x;  // [≤ M, hidden] those rows' inputs
  std::vector<float> y;  // [≤ M, hidden] the expert's (partial) outputs
  RouterScratch router;
};

// y [rows, hidden] = down(silu(gate(x)) · up(x)) over the `width` intermediate columns `w`
// holds (a rank's slice); zeros when width is 0. x [rows, hidden].
void GatedMlp(const DenseMlpWeights& w, const float* x, int rows, int hidden, int width,
              MlpScratch& scratch, float* y);

// out [M, hidden] = Σ over each row's routed experts (ascending) of weight · expert(h), then
// + shared_experts(h), over this rank's columns of every expert (TpRankPlan::MlpColumns).
// The router runs on every rank on the same h and gives the same choices. h [M, hidden].
void MoeMlp(const ModelConfig& config, const MoeWeights& w, const TpRankPlan& plan, const float* h,
            int m, MlpScratch& scratch, float* out);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_CPU_MLP_H_
