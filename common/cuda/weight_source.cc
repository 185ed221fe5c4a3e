#include "common/cuda/weight_source.h"

#include <cmath>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/random_fill.h"
#include "common/model/dtype.h"
#include "common/model/tp_shard.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

using bf16 = __nv_bfloat16;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The slots of the tensors `config` uses (full shapes and kinds; no storage), by Hugging Face
// name.
std::shared_ptr<absl::flat_hash_map<std::string, TensorSlot>> Slots(const ModelConfig& config) {
  auto slots = std::make_shared<absl::flat_hash_map<std::string, TensorSlot>>();
  ModelWeights empty;
  ForEachTensor(config, empty, [&](TensorSlot& slot) {
    if (!slot.present) return;
    TensorSlot& kept = (*slots)[slot.hf_name] = slot;
    kept.tensor = nullptr;
  });
  return slots;
}

}  // namespace

TensorSource HostTensors(const ModelConfig& config, const ModelWeights& weights) {
  auto by_name = std::make_shared<absl::flat_hash_map<std::string, TensorSlot>>();
  // ForEachTensor only reads here; it takes a mutable reference for the loader's sake.
  ForEachTensor(config, const_cast<ModelWeights&>(weights), [&](TensorSlot& slot) {
    if (slot.present) (*by_name)[slot.hf_name] = slot;
  });
  return [by_name](const std::string& name) -> absl::StatusOr<DeviceTensor> {
    const auto it = by_name->find(name);
    if (it == by_name->end()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
    const Tensor& t = *it->second.tensor;
    std::vector<uint16_t> host(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) host[i] = FloatToBf16Bits(t.data()[i]);
    DeviceTensor out;
    out.shape = t.shape();
    out.kind = it->second.kind;
    ASSIGN_OR_RETURN(out.data, DeviceBuffer<bf16>::Create(host.size()));
    RETURN_IF_ERROR(out.data.CopyFromHost(
        absl::MakeConstSpan(reinterpret_cast<const bf16*>(host.data()), host.size())));
    return out;
  };
}

TensorSource RandomTensors(const ModelConfig& config, uint64_t seed, cudaStream_t stream,
                           RandomStyle style) {
  auto slots = Slots(config);
  const int hidden = config.hidden_size;
  return [slots, seed, stream, hidden,
          style](const std::string& name) -> absl::StatusOr<DeviceTensor> {
    const auto it = slots->find(name);
    if (it == slots->end()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
    DeviceTensor out;
    out.shape = it->second.shape;
    out.kind = it->second.kind;
    const int64_t n = Numel(out.shape);
    ASSIGN_OR_RETURN(out.data, DeviceBuffer<bf16>::Create(n));
    const RandomSpread spread = RandomSpreadOf(it->second, hidden);
    const float center = spread.center;
    float sigma = spread.sigma;
    std::string key = name;
    if (style == RandomStyle::kDecisive) {
      if (name == "lm_head.weight") key = "model.embed_tokens.weight";
      // The blocks' output projections, which add to the residual stream.
      if (out.kind == SlotKind::kQHeadsIn || out.kind == SlotKind::kMlpIn) sigma *= 1e-3f;
    }
    CUDA_RETURN_IF_ERROR(LaunchFillUniformBf16(out.data.data(), n,
                                               seed ^ std::hash<std::string>{}(key), center,
                                               std::sqrt(3.0f) * sigma, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return out;
  };
}

absl::StatusOr<DeviceBuffer<bf16>> MakeShard(const TensorSource& source, const ModelConfig& config,
                                             const TpRankPlan& plan,
                                             std::initializer_list<std::string> names,
                                             cudaStream_t stream) {
  std::vector<DeviceTensor> full;
  std::vector<TpSlice> slices;
  int64_t total = 0;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(DeviceTensor t, source(name));
    TpSlice s = TpSliceOf(config, t.kind, t.shape, plan);
    const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
    if (s.axis == TpSlice::Axis::kAll) s = {TpSlice::Axis::kRows, 0, rows};
    const int64_t limit = s.axis == TpSlice::Axis::kRows ? rows : cols;
    if (s.begin < 0 || s.end < s.begin || s.end > limit) {
      return absl::InternalError(
          absl::StrCat("slice [", s.begin, ", ", s.end, ") of ", name, " outside its ", limit));
    }
    total += (s.end - s.begin) * (s.axis == TpSlice::Axis::kRows ? cols : rows);
    full.push_back(std::move(t));
    slices.push_back(s);
  }
  ASSIGN_OR_RETURN(DeviceBuffer<bf16> out, DeviceBuffer<bf16>::Create(total));
  int64_t at = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const DeviceTensor& t = full[i];
    const TpSlice& s = slices[i];
    const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
    const int64_t width = s.end - s.begin;
    if (width == 0) continue;
    if (s.axis == TpSlice::Axis::kRows) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data() + at, t.data.data() + s.begin * cols,
                                           width * cols * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                           stream));
      at += width * cols;
    } else {  // columns [begin, end) of every row
      CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          out.data() + at, width * sizeof(bf16), t.data.data() + s.begin, cols * sizeof(bf16),
          width * sizeof(bf16), rows, cudaMemcpyDeviceToDevice, stream));
      at += width * rows;
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before `full` is freed
  return out;
}

}  // namespace treespec::gpu
