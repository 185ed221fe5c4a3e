// How a model is split over tensor-parallel ranks (DESIGN §6, Megatron layout).
//
// Any rank count from 1 to num_q_heads works:
//  - q heads are split as evenly as possible (the last ranks take the remainder);
//  - a rank holds every KV head its q heads read, so a GQA group that straddles two ranks has
//    its KV head duplicated on both;
//  - the MLP width is split evenly in units of 64 columns (the last ranks take the extra units,
//    the last rank any part-unit), so a rank may hold no MLP columns when tp > width / 64; a
//    MoE layer's experts (each of them) and its shared experts are split the same way by their
//    own widths, so every rank runs every expert's slice (no all-to-all; see tp_shard.h);
//  - the vocabulary (embedding and LM head rows) is split as evenly as possible.
#ifndef TREESPEC_COMMON_MODEL_TP_PLAN_H_
#define TREESPEC_COMMON_MODEL_TP_PLAN_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace treespec {

// Half-open ranges of global indices a rank owns.
struct TpRankPlan {
  int rank = 0, world_size = 1;
  int q_head_begin = 0, q_head_end = 0;    // q heads [begin, end)
  int kv_head_begin = 0, kv_head_end = 0;  // KV heads held (may overlap the neighbours')
  int mlp_begin = 0, mlp_end = 0;          // intermediate columns
  int vocab_begin = 0, vocab_end = 0;      // vocabulary rows

  int num_q_heads() const { return q_head_end - q_head_begin; }
  int num_kv_heads() const { return kv_head_end - kv_head_begin; }
  int mlp_width() const { return mlp_end - mlp_begin; }
  int vocab_size() const { return vocab_end - vocab_begin; }
  // This rank's columns [first, second) of an MLP `width` wide (the dense MLP's are
  // [mlp_begin, mlp_end); an expert's and the shared experts' come from their widths).
  std::pair<int, int> MlpColumns(int width) const;
};

struct TpPlan {
  int group_size = 1;             // q heads per KV head
  std::vector<TpRankPlan> ranks;  // [tp]

  int world_size() const { return static_cast<int>(ranks.size()); }
  // Largest vocab slice over ranks (the padded all-gather width).
  int max_vocab_slice() const;
};

// The MLP width is split in multiples of this many columns.
inline constexpr int kMlpSplitUnit = 64;

// INVALID_ARGUMENT when tp < 1, tp > num_q_heads, or the config's heads do not form GQA groups.
absl::StatusOr<TpPlan> MakeTpPlan(const ModelConfig& config, int tp);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_TP_PLAN_H_
