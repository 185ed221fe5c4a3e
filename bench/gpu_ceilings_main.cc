// treespec-gpu-ceilings: measures the GPU's device-copy bandwidth and bf16 GEMM rate (the
// ceilings of DESIGN §7) and prints them as one JSON object for later benchmarks:
//
//   treespec-gpu-ceilings [--device=0]
//   {"bf16_gemm_flops_per_s":6.9e+14,"copy_bandwidth_bytes_per_s":4.24e+12,"device":"NVIDIA H200"}
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/gpu_ceilings.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/gemm.h"
#include "common/util/status_macros.h"

ABSL_FLAG(int, device, 0, "CUDA device to measure");

namespace treespec::gpu {
namespace {

absl::StatusOr<nlohmann::json> MeasureCeilings(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t raw_stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> stream(raw_stream,
                                                                           cudaStreamDestroy);
  ASSIGN_OR_RETURN(const GpuCeilings c, MeasureGpuCeilings(stream.get()));
  return nlohmann::json{{"copy_bandwidth_bytes_per_s", c.copy_bandwidth},
                        {"bf16_gemm_flops_per_s", c.bf16_gemm_rate},
                        {"device", c.device}};
}

}  // namespace
}  // namespace treespec::gpu

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures the GPU's copy bandwidth and bf16 GEMM rate; prints them as JSON.");
  absl::ParseCommandLine(argc, argv);
  const absl::StatusOr<nlohmann::json> ceilings =
      treespec::gpu::MeasureCeilings(absl::GetFlag(FLAGS_device));
  if (!ceilings.ok()) {
    std::fprintf(stderr, "%s\n", ceilings.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", ceilings->dump().c_str());
  return 0;
}
