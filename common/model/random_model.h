// Random-weight checkpoints in Hugging Face layout, for tests and benchmarks: config.json with
// the field names transformers uses (so transformers can load the result too) plus safetensors,
// written tensor by tensor so memory stays bounded for any model size.
#ifndef TREESPEC_COMMON_MODEL_RANDOM_MODEL_H_
#define TREESPEC_COMMON_MODEL_RANDOM_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/weights.h"

namespace treespec {

struct RandomModelOptions {
  DType dtype = DType::kF32;  // storage type of every tensor
  int num_shards = 1;         // > 1: model-0000k-of-0000n.safetensors + index.json
  uint64_t seed = 0;
  float init_std = 0.02f;      // N(0, init_std) for matrices and biases; norms 1 + N(0, init_std)
  std::string tokenizer_path;  // optional tokenizer.json copied into the model directory
};

// config.json text for `config` under its architecture's transformers field names.
// `dtype` becomes `torch_dtype`; `initializer_range` is informational.
std::string ModelConfigToHfJson(const ModelConfig& config, DType dtype,
                                float initializer_range = 0.02f);

// The fp32 values of tensor `hf_name` (a slot of `kind`) from element `begin` on (before
// rounding to the storage dtype), as WriteRandomModel writes them: a pure function of (seed,
// name, index), so sharding and chunking do not change them. Norm weights are 1 + noise.
void RandomTensorValues(uint64_t seed, float init_std, const std::string& hf_name, SlotKind kind,
                        int64_t begin, absl::Span<float> out);

// Creates `dir` if needed and writes config.json, the safetensors file(s) and, when asked,
// tokenizer.json. Stale checkpoint files in `dir` (model*.safetensors, the index) are removed
// first so a loader cannot pick up a previous layout.
absl::Status WriteRandomModel(const ModelConfig& config, const RandomModelOptions& options,
                              const std::string& dir);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_RANDOM_MODEL_H_
