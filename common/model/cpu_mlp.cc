#include "common/model/cpu_mlp.h"

#include <algorithm>

#include "common/model/cpu_ops.h"

namespace treespec {

void GatedMlp(const DenseMlpWeights& w, const float* x, int rows, int hidden, int width,
              MlpScratch& s, float* y) {
  if (width == 0) {  // a rank with no columns of this MLP contributes zeros
    std::fill(y, y + static_cast<size_t>(rows) * hidden, 0.0f);
    return;
  }
  s.gate.resize(static_cast<size_t>(rows) * width);
  s.up.resize(static_cast<size_t>(rows) * width);
  MatMul(x, w.w_gate.data(), rows, width, hidden, s.gate.data());  // [rows, width]
  MatMul(x, w.w_up.data(), rows, width, hidden, s.up.data());      // [rows, width]
  SiluMul(s.gate.data(), s.up.data(), s.gate.size(), s.gate.data());
  MatMul(s.gate.data(), w.w_down.data(), rows, hidden, width, y);  // [rows, hidden]
}

void MoeMlp(const ModelConfig& config, const MoeWeights& w, const TpRankPlan& plan, const float* h,
            int m, MlpScratch& s, float* out) {
  const MoeConfig& e = config.moe;
  const int hidden = config.hidden_size, k = e.experts_per_token;
  s.logits.resize(static_cast<size_t>(m) * e.num_experts);
  MatMul(h, w.router.data(), m, e.num_experts, hidden, s.logits.data());  // [M, E], fp32
  s.choices.resize(static_cast<size_t>(m) * k);
  for (int i = 0; i < m; ++i) {
    RouteRow(e, s.logits.data() + static_cast<size_t>(i) * e.num_experts, w.score_bias.data(),
             s.router, absl::MakeSpan(s.choices).subspan(static_cast<size_t>(i) * k, k));
  }

  std::fill(out, out + static_cast<size_t>(m) * hidden, 0.0f);
  const auto [begin, end] = plan.MlpColumns(e.expert_intermediate_size);
  if (end > begin) {
    s.routed.resize(e.num_experts);
    for (auto& rows : s.routed) rows.clear();
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < k; ++j) {
        const ExpertChoice& c = s.choices[static_cast<size_t>(i) * k + j];
        s.routed[c.expert].push_back({i, c.weight});
      }
    }
  }
  // Experts in increasing index: every row adds its experts' outputs in that order.
  for (int x = 0; x < e.num_experts && end > begin; ++x) {
    const std::vector<std::pair<int, float>>& rows = s.routed[x];
    if (rows.empty()) continue;
    const int n = static_cast<int>(rows.size());
    s.x.resize(static_cast<size_t>(n) * hidden);
    for (int r = 0; r < n; ++r) {
      std::copy_n(h + static_cast<size_t>(rows[r].first) * hidden, hidden,
                  s.x.begin() + static_cast<size_t>(r) * hidden);
    }
    s.y.resize(static_cast<size_t>(n) * hidden);
    GatedMlp(w.experts[x], s.x.data(), n, hidden, end - begin, s, s.y.data());
    for (int r = 0; r < n; ++r) {
      const float weight = rows[r].second;
      const float* y = s.y.data() + static_cast<size_t>(r) * hidden;
      float* o = out + static_cast<size_t>(rows[r].first) * hidden;
      for (int c = 0; c < hidden; ++c) o[c] += weight * y[c];
    }
  }

  const auto [shared_begin, shared_end] =
      plan.MlpColumns(e.expert_intermediate_size * e.num_shared_experts);
  if (shared_end == shared_begin) return;
  s.y.resize(static_cast<size_t>(m) * hidden);
  GatedMlp(w.shared, h, m, hidden, shared_end - shared_begin, s, s.y.data());
  AddInPlace(s.y.data(), static_cast<int64_t>(m) * hidden, out);
}

}  // namespace treespec
