#include "common/backend/load_model.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model/cpu_causal_lm.h"
#include "common/model/dflash_weights.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

#if TREESPEC_WITH_CUDA
#include "common/cuda/cuda_causal_lm.h"
#endif

namespace treespec {
namespace {

int GpuCount() {
#if TREESPEC_WITH_CUDA
  return gpu::CudaDeviceCount();
#else
  return 0;
#endif
}

// "cuda:a,b,..." for `devices`.
std::string CudaName(const std::vector<int>& devices) {
  return absl::StrCat("cuda:", absl::StrJoin(devices, ","));
}

// The GPU list of a resolved "cuda:a,b,..." name.
absl::StatusOr<std::vector<int>> ParseCudaList(const std::string& flag, absl::string_view list) {
  std::vector<int> devices;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int ordinal = 0;
    if (!absl::SimpleAtoi(part, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", flag, ": want cuda:N or cuda:N,M,... (GPU ordinals)"));
    }
    devices.push_back(ordinal);
  }
  return devices;
}

}  // namespace

absl::StatusOr<std::string> ResolveDevice(const std::string& device, const LmOptions& options) {
  const int tp = options.tensor_parallel;
  if (device == "cpu") return std::string("cpu");
  const int gpus = GpuCount();
  if (device == "auto" || device.empty()) {
    if (gpus == 0) return std::string("cpu");
    if (tp > gpus) {
      TS_LOG(kWarning, "--device=auto: --tp=%d needs %d GPUs, %d present; running on the CPU", tp,
             tp, gpus);
      return std::string("cpu");
    }
    std::vector<int> devices;
    for (int r = 0; r < tp; ++r) devices.push_back(r);
    return CudaName(devices);
  }
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    std::vector<int> devices;
    if (device == "cuda") {
      for (int r = 0; r < tp; ++r) devices.push_back(r);
    } else {
      absl::StatusOr<std::vector<int>> listed = ParseCudaList(device, device.substr(5));
      if (!listed.ok()) return listed.status();
      devices = *listed;
      // One ordinal with --tp > 1: that many consecutive GPUs from it.
      for (int r = 1; devices.size() == 1 && r < tp; ++r) devices.push_back(devices[0] + r);
    }
#if TREESPEC_WITH_CUDA
    if (gpus == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", device, ": no CUDA device is usable on this machine"));
    }
    if (static_cast<int>(devices.size()) != tp) {
      return absl::InvalidArgumentError(absl::StrCat("--device=", device, " lists ", devices.size(),
                                                     " GPUs but --tp=", tp, " (one GPU per rank)"));
    }
    for (int d : devices) {
      if (d >= gpus) {
        return absl::InvalidArgumentError(
            absl::StrCat("--device=", device, ": GPU ", d, " does not exist (", gpus, " present)"));
      }
    }
    return CudaName(devices);
#else
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, ": this build has no CUDA backend (built without nvcc)"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", device, ": want auto, cpu, cuda, cuda:N or cuda:N,M,..."));
}

absl::StatusOr<std::unique_ptr<CausalLm>> CreateCausalLm(const ModelConfig& config,
                                                         ModelWeights weights,
                                                         const std::string& device,
                                                         const LmOptions& options) {
  ASSIGN_OR_RETURN(const std::string resolved, ResolveDevice(device, options));
  if (resolved == "cpu") return CreateCpuCausalLm(config, std::move(weights), options);
#if TREESPEC_WITH_CUDA
  gpu::CudaLmOptions cuda;
  ASSIGN_OR_RETURN(cuda.devices, ParseCudaList(resolved, resolved.substr(5)));
  return gpu::CreateCudaCausalLm(config, weights, options, cuda);
#else
  return absl::InternalError(absl::StrCat("unreachable device ", resolved));
#endif
}

absl::StatusOr<DflashLm> LoadDflashLm(const std::string& drafter_dir, const std::string& target_dir,
                                      const std::string& device, const LmOptions& options) {
  DflashLm out;
  ASSIGN_OR_RETURN(out.config, LoadDflashConfig(drafter_dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadDflashWeights(drafter_dir, out.config, target_dir));
  ASSIGN_OR_RETURN(out.lm, CreateCausalLm(out.config.body, std::move(weights), device, options));
  return out;
}

absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCausalLm(const std::string& model_dir,
                                                               const std::string& device,
                                                               const LmOptions& options,
                                                               uint64_t seed) {
  ASSIGN_OR_RETURN(const std::string resolved, ResolveDevice(device, options));
  if (resolved == "cpu") {
    return absl::InvalidArgumentError(
        "random weights are made on a GPU (--device=cuda...): on the CPU, write a random "
        "checkpoint with treespec-random-model and load that");
  }
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
#if TREESPEC_WITH_CUDA
  gpu::CudaLmOptions cuda;
  ASSIGN_OR_RETURN(cuda.devices, ParseCudaList(resolved, resolved.substr(5)));
  return gpu::CreateRandomCudaCausalLm(config, seed, options, cuda, gpu::RandomStyle::kDecisive);
#else
  (void)seed;
  return absl::InternalError(absl::StrCat("unreachable device ", resolved));
#endif
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadCausalLm(const std::string& model_dir,
                                                       const std::string& device,
                                                       const LmOptions& options) {
  absl::StatusOr<std::string> resolved = ResolveDevice(device, options);
  if (!resolved.ok()) return resolved.status();
  if (*resolved == "cpu") return LoadCpuCausalLm(model_dir, options);
#if TREESPEC_WITH_CUDA
  gpu::CudaLmOptions cuda;
  absl::StatusOr<std::vector<int>> devices = ParseCudaList(*resolved, resolved->substr(5));
  if (!devices.ok()) return devices.status();
  cuda.devices = *devices;
  return gpu::LoadCudaCausalLm(model_dir, options, cuda);
#else
  return absl::InternalError(absl::StrCat("unreachable device ", *resolved));
#endif
}

}  // namespace treespec
