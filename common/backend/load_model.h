// Choosing the model backend by flag (issue 3 items 3 and 6): `--device=auto|cpu|cuda|cuda:N|
// cuda:N,M,...` with `--tp` for both services. auto picks the CUDA backend when this build has
// it and at least --tp GPUs are present (GPUs 0..tp-1), else the CPU reference. cuda:N with
// --tp > 1 means tp consecutive GPUs from N; a list names one GPU per rank.
#ifndef TREESPEC_COMMON_BACKEND_LOAD_MODEL_H_
#define TREESPEC_COMMON_BACKEND_LOAD_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/causal_lm.h"
#include "common/model/dflash_config.h"
#include "common/model/weights.h"

namespace treespec {

// The backend `device` resolves to here: "cpu" or "cuda:N[,M...]" (one GPU per rank).
// INVALID_ARGUMENT names the flag for an unknown value, a CUDA device in a CPU-only build or on
// a machine without a GPU, a GPU that is not there, or a list whose length is not --tp.
absl::StatusOr<std::string> ResolveDevice(const std::string& device, const LmOptions& options);

// Loads `model_dir` on the backend `device` names (as ResolveDevice).
absl::StatusOr<std::unique_ptr<CausalLm>> LoadCausalLm(const std::string& model_dir,
                                                       const std::string& device,
                                                       const LmOptions& options);

// A model of the config.json in `model_dir` (no other file is read) with pseudo-random weights
// made on the GPU from `seed`: benchmarks at a real model's shape without its checkpoint (the
// replay drafter gives such a target a controlled acceptance). The weights are
// gpu::RandomStyle::kDecisive: greedy decoding repeats the last token, the same whatever rows
// a step runs, so a recorded output replays exactly. CUDA only: the CPU backend would
// hold fp32 weights of that size on the host; write a checkpoint with treespec-random-model
// instead.
absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCausalLm(const std::string& model_dir,
                                                               const std::string& device,
                                                               const LmOptions& options,
                                                               uint64_t seed);

// Makes a model of `config` from host weights on the backend `device` names.
absl::StatusOr<std::unique_ptr<CausalLm>> CreateCausalLm(const ModelConfig& config,
                                                         ModelWeights weights,
                                                         const std::string& device,
                                                         const LmOptions& options);

// A DFlash drafter (arXiv 2602.06036) as the CausalLm that runs it: the draft layers with the
// target's embedding and head and the context projection (dflash_config.h).
struct DflashLm {
  DflashConfig config;
  std::unique_ptr<CausalLm> lm;
};
// Loads the drafter in `drafter_dir` with the embedding and head of the target in `target_dir`
// (LoadDflashWeights) on the backend `device` names.
absl::StatusOr<DflashLm> LoadDflashLm(const std::string& drafter_dir, const std::string& target_dir,
                                      const std::string& device, const LmOptions& options);

}  // namespace treespec

#endif  // TREESPEC_COMMON_BACKEND_LOAD_MODEL_H_
