#include "common/model/tp_shard.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

// Rows [begin, end) of a rank-1 or rank-2 tensor (for rank 1: elements).
Tensor CopyRows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t width = t.rank() == 2 ? t.dim(1) : 1;
  std::vector<int64_t> shape = t.shape();
  shape[0] = end - begin;
  std::vector<float> data(t.data() + begin * width, t.data() + end * width);
  return Tensor(std::move(shape), std::move(data));
}

// Columns [begin, end) of a rank-2 tensor.
Tensor CopyColumns(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1), width = end - begin;
  std::vector<float> data(rows * width);
  // width 0 (a rank without MLP columns): data() may be null, and memcpy must not see it.
  for (int64_t r = 0; width > 0 && r < rows; ++r) {
    std::memcpy(data.data() + r * width, t.data() + r * cols + begin, width * sizeof(float));
  }
  return Tensor({rows, width}, std::move(data));
}

// Pointers to the tensors of `weights` in ForEachTensor order.
std::vector<const Tensor*> TensorsInOrder(const ModelConfig& config, const ModelWeights& weights) {
  std::vector<const Tensor*> out;
  // ForEachTensor takes a mutable ModelWeights (the loader fills it); here it only lists
  // pointers. layers already has num_layers entries when the weights are valid, and
  // ValidateWeightShapes checks that before anything is read.
  ForEachTensor(config, const_cast<ModelWeights&>(weights),
                [&](TensorSlot& slot) { out.push_back(slot.tensor); });
  return out;
}

}  // namespace

absl::Status ValidateWeightShapes(const ModelConfig& config, const ModelWeights& weights) {
  if (static_cast<int>(weights.layers.size()) != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", weights.layers.size(),
                                                   " layers, config says ", config.num_layers));
  }
  absl::Status status;
  ForEachTensor(config, const_cast<ModelWeights&>(weights), [&](TensorSlot& slot) {
    if (!status.ok()) return;
    const Tensor& t = *slot.tensor;
    if (!slot.present) {
      if (!t.empty()) {
        status = absl::InvalidArgumentError(absl::StrCat(
            slot.hf_name, " is present ", t.ShapeString(), " but the config does not use it"));
      }
      return;
    }
    if (t.shape() != slot.shape) {
      status = absl::InvalidArgumentError(absl::StrCat(slot.hf_name, " has shape ", t.ShapeString(),
                                                       ", expected [",
                                                       absl::StrJoin(slot.shape, ", "), "]"));
    }
  });
  return status;
}

TpSlice TpSliceOf(const ModelConfig& config, SlotKind kind, absl::Span<const int64_t> shape,
                  const TpRankPlan& p) {
  using Axis = TpSlice::Axis;
  // A head's width from the slot itself: q_proj's rows are heads × head_dim, MLA's kv_b_proj's
  // heads × (nope + v), its o_proj's columns heads × v_head_dim.
  const int64_t out = shape.empty() ? 0 : shape[0], in = shape.size() == 2 ? shape[1] : 0;
  switch (kind) {
    case SlotKind::kVocab:
      return {Axis::kRows, p.vocab_begin, p.vocab_end};
    case SlotKind::kQHeads: {
      const int64_t d = out / config.num_q_heads;
      return {Axis::kRows, p.q_head_begin * d, p.q_head_end * d};
    }
    case SlotKind::kKvHeads: {
      const int64_t d = out / config.num_kv_heads;
      return {Axis::kRows, p.kv_head_begin * d, p.kv_head_end * d};
    }
    case SlotKind::kQHeadsIn: {
      const int64_t d = in / config.num_q_heads;
      return {Axis::kColumns, p.q_head_begin * d, p.q_head_end * d};
    }
    case SlotKind::kMlpOut: {
      const auto [begin, end] = p.MlpColumns(static_cast<int>(out));
      return {Axis::kRows, begin, end};
    }
    case SlotKind::kMlpIn: {
      const auto [begin, end] = p.MlpColumns(static_cast<int>(in));
      return {Axis::kColumns, begin, end};
    }
    case SlotKind::kNorm:
    case SlotKind::kWhole:
      break;
  }
  return {};
}

absl::StatusOr<ModelWeights> ShardWeights(const ModelConfig& config, const ModelWeights& full,
                                          const TpPlan& plan, int rank) {
  if (rank < 0 || rank >= plan.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range [0, ", plan.world_size(), ")"));
  }
  RETURN_IF_ERROR(ValidateWeightShapes(config, full));
  const TpRankPlan& p = plan.ranks[rank];
  const std::vector<const Tensor*> source = TensorsInOrder(config, full);

  ModelWeights shard;
  size_t index = 0;
  ForEachTensor(config, shard, [&](TensorSlot& slot) {
    const Tensor& t = *source[index++];
    if (!slot.present) return;
    const TpSlice slice = TpSliceOf(config, slot.kind, slot.shape, p);
    switch (slice.axis) {
      case TpSlice::Axis::kRows:
        *slot.tensor = CopyRows(t, slice.begin, slice.end);
        break;
      case TpSlice::Axis::kColumns:
        *slot.tensor = CopyColumns(t, slice.begin, slice.end);
        break;
      case TpSlice::Axis::kAll:
        *slot.tensor = t.Clone();
        break;
    }
  });
  return shard;
}

}  // namespace treespec
