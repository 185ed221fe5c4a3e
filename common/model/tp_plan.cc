#include "common/model/tp_plan.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace treespec {
namespace {

// Splits [0, total) into `parts` ranges of whole `unit`s, as even as possible; the last ranks
// take the extra units and the last rank the part-unit left over when unit does not divide.
std::vector<std::pair<int, int>> SplitEvenly(int total, int parts, int unit) {
  const int units = total / unit;
  const int base = units / parts, extra = units % parts;
  std::vector<std::pair<int, int>> ranges;
  int begin = 0;
  for (int r = 0; r < parts; ++r) {
    int size = (base + (r >= parts - extra ? 1 : 0)) * unit;
    if (r == parts - 1) size = total - begin;
    ranges.push_back({begin, begin + size});
    begin += size;
  }
  return ranges;
}

}  // namespace

std::pair<int, int> TpRankPlan::MlpColumns(int width) const {
  return SplitEvenly(width, world_size, kMlpSplitUnit)[rank];
}

int TpPlan::max_vocab_slice() const {
  int most = 0;
  for (const TpRankPlan& r : ranks) most = std::max(most, r.vocab_size());
  return most;
}

absl::StatusOr<TpPlan> MakeTpPlan(const ModelConfig& config, int tp) {
  if (tp < 1 || tp > config.num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", tp, " out of range [1, ",
                                                   config.num_q_heads, "] (the model has ",
                                                   config.num_q_heads, " attention heads)"));
  }
  if (config.num_kv_heads < 1 || config.num_q_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", config.num_q_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   config.num_kv_heads));
  }
  TpPlan plan;
  plan.group_size = config.num_q_heads / config.num_kv_heads;
  const auto heads = SplitEvenly(config.num_q_heads, tp, 1);
  const auto mlp = SplitEvenly(config.intermediate_size, tp, kMlpSplitUnit);
  const auto vocab = SplitEvenly(config.vocab_size, tp, 1);
  for (int r = 0; r < tp; ++r) {
    TpRankPlan p;
    p.rank = r;
    p.world_size = tp;
    p.q_head_begin = heads[r].first;
    p.q_head_end = heads[r].second;
    p.kv_head_begin = p.q_head_begin / plan.group_size;
    p.kv_head_end = (p.q_head_end - 1) / plan.group_size + 1;
    std::tie(p.mlp_begin, p.mlp_end) = mlp[r];
    p.vocab_begin = vocab[r].first;
    p.vocab_end = vocab[r].second;
    plan.ranks.push_back(p);
  }
  return plan;
}

}  // namespace treespec
