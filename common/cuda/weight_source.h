// Where the CUDA backend's weights come from, and how one tensor-parallel rank's share of them
// is cut on the device. A TensorSource makes one named Hugging Face tensor in full on the
// current device (bf16); MakeShard slices it by the rank's rule for its slot kind (TpSliceOf,
// the CPU sharder's table) and concatenates several along dim 0 (fused QKV and gate/up
// projections).
#ifndef TREESPEC_COMMON_CUDA_WEIGHT_SOURCE_H_
#define TREESPEC_COMMON_CUDA_WEIGHT_SOURCE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"
#include "common/model/config.h"
#include "common/model/tp_plan.h"
#include "common/model/weights.h"

namespace treespec::gpu {

struct DeviceTensor {
  DeviceBuffer<__nv_bfloat16> data;
  std::vector<int64_t> shape;        // full Hugging Face shape, [out, in] or [n]
  SlotKind kind = SlotKind::kWhole;  // its slot's (ForEachTensor): how a rank's share is cut
};

// Makes the named tensor on the current device; INVALID_ARGUMENT for a name the config lacks.
using TensorSource = std::function<absl::StatusOr<DeviceTensor>(const std::string& name)>;

// From host fp32 tensors (a loaded checkpoint), rounded to bf16. `weights` must outlive the
// source.
TensorSource HostTensors(const ModelConfig& config, const ModelWeights& weights);

// What a random model's values are like.
enum class RandomStyle {
  // RandomSpreadOf's spreads (testing::RandomWeights' too): norms 1 ± 0.2, biases std 0.3,
  // embedding and head std 3/sqrt(hidden), projections std 1/sqrt(in). Its logits are ~N(0, 3²)
  // over the vocabulary, so the top two of an 8B shape's 128k are often within bf16 noise of
  // each other: which token greedy decoding picks can change with the rows a step runs (a tree
  // or one token).
  kSpread,
  // The same, except that the LM head holds the embedding's values and the layers' output
  // projections (o_proj, down_proj) are 1000× smaller: the residual stream stays near the
  // current token's embedding, whose own logit leads every other by ~10× the bf16 noise, so
  // greedy decoding repeats the last token whatever rows a step runs. For benchmarks whose
  // drafter replays the target's recorded output (drafter_service/replay_drafter.h): the time
  // of every kernel is the same as kSpread's.
  kDecisive,
};

// Pseudo-random values of `style` made on the device, keyed by (seed, name), so every rank
// slices the same full model.
TensorSource RandomTensors(const ModelConfig& config, uint64_t seed, cudaStream_t stream,
                           RandomStyle style = RandomStyle::kSpread);

// Rank `plan`'s slices of `names` (TpSliceOf of each one's kind), concatenated along dim 0, on the
// current device.
absl::StatusOr<DeviceBuffer<__nv_bfloat16>> MakeShard(const TensorSource& source,
                                                      const ModelConfig& config,
                                                      const TpRankPlan& plan,
                                                      std::initializer_list<std::string> names,
                                                      cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_WEIGHT_SOURCE_H_
