#include "common/backend/load_model.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/log.h"

#if TREESPEC_WITH_CUDA
#include "common/cuda/cuda_causal_lm.h"
#endif

namespace treespec {
namespace {

bool GpuPresent() {
#if TREESPEC_WITH_CUDA
  return gpu::CudaDeviceAvailable();
#else
  return false;
#endif
}

}  // namespace

absl::StatusOr<std::string> ResolveDevice(const std::string& device, const LmOptions& options) {
  if (device == "cpu") return std::string("cpu");
  if (device == "auto" || device.empty()) {
    if (!GpuPresent()) return std::string("cpu");
    if (options.tensor_parallel > 1) {
      TS_LOG(kWarning,
             "--device=auto: --tp=%d runs on the CPU backend (the CUDA backend is one "
             "GPU until NCCL tensor parallelism lands)",
             options.tensor_parallel);
      return std::string("cpu");
    }
    return std::string("cuda:0");
  }
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    int ordinal = 0;
    if (device != "cuda" && !absl::SimpleAtoi(device.substr(5), &ordinal)) {
      return absl::InvalidArgumentError(absl::StrCat("--device=", device, ": want cuda:N"));
    }
#if TREESPEC_WITH_CUDA
    if (!GpuPresent()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", device, ": no CUDA device is usable on this machine"));
    }
    return absl::StrCat("cuda:", ordinal);
#else
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, ": this build has no CUDA backend (built without nvcc)"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", device, ": want auto, cpu, cuda or cuda:N"));
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadCausalLm(const std::string& model_dir,
                                                       const std::string& device,
                                                       const LmOptions& options) {
  absl::StatusOr<std::string> resolved = ResolveDevice(device, options);
  if (!resolved.ok()) return resolved.status();
  if (*resolved == "cpu") return LoadCpuCausalLm(model_dir, options);
#if TREESPEC_WITH_CUDA
  gpu::CudaLmOptions cuda;
  if (!absl::SimpleAtoi(resolved->substr(5), &cuda.device)) {
    return absl::InternalError(absl::StrCat("bad device ", *resolved));
  }
  return gpu::LoadCudaCausalLm(model_dir, options, cuda);
#else
  return absl::InternalError(absl::StrCat("unreachable device ", *resolved));
#endif
}

}  // namespace treespec
