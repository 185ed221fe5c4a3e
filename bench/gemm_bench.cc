// treespec-gemm-bench: the GEMMs of a verify step (few rows, Llama-3-8B weights) against their
// memory floor, through each kernel GemmRunner can use: cuBLASLt, and our few-row kernel with
// and without programmatic dependent launch and with its shallow pipeline only (gemm.h,
// skinny_gemm.h).
//
//   treespec-gemm-bench [--rows=1,16,32,64] [--tp=1] [--chain=24] [--reps=10]
//                       [--cublas_candidates=N] [--json=out.json]
//
// Per shape (qkv, o_proj, gate_up, gate_silu = gate_up with the SiLU·mul epilogue, down,
// lm_head; each rank's slice for --tp) and row count:
//   chain_us  = one GEMM's share of a chain of --chain back-to-back GEMMs, each through its own
//               copy of the weights (more bytes than L2 holds), as the layers of a step run
//               them: the median chain of --reps;
//   single_us = one GEMM after reading a buffer larger than L2 (bench/l2_flush.h): the median of
//               --reps;
//   hot_us    = the same chain through one copy of the weights: for weights L2 holds (qkv,
//               o_proj), what the kernel takes when its bytes come from L2, i.e. the best an L2
//               prefetch ahead of it could give;
//   floor_us  = (w + x + y bytes) / copy bandwidth (measured here first).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu_ceilings.h"
#include "bench/l2_flush.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/gemm.h"
#include "common/cuda/skinny_gemm.h"
#include "common/util/status_macros.h"

ABSL_FLAG(std::vector<std::string>, rows, std::vector<std::string>({"1", "16", "32", "64"}),
          "rows of x (tokens of the step)");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks: the shapes are one rank's slices");
ABSL_FLAG(int, chain, 24, "GEMMs per timed chain");
ABSL_FLAG(int, reps, 10, "timed chains (and single launches) per point");
ABSL_FLAG(int, cublas_candidates, 1,
          "also time cuBLASLt's 2nd .. N-th heuristic candidates (GemmOptions::cublas_candidate)");
ABSL_FLAG(std::string, json, "", "also write the results here");

namespace treespec::gpu {
namespace {

constexpr size_t kChainBytes = size_t{1} << 30;  // weight copies of a chain: >= 1 GiB

struct Shape {
  const char* name;
  int n, k;
  bool f32_output;
  GemmEpilogue epilogue = GemmEpilogue::kNone;  // kSiluMul: the few-row kernel only
};

struct Kernel {
  std::string name;
  GemmOptions options;
  bool tune = false;  // GemmRunner::Tune before the first run (as a model does at load)
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<nlohmann::json> RunCase(const Shape& s, int rows, const Kernel& kernel,
                                       const GpuCeilings& ceilings, L2Flush& flush,
                                       cudaStream_t stream) {
  ASSIGN_OR_RETURN(std::unique_ptr<GemmRunner> gemm,
                   GemmRunner::Create(kDefaultGemmWorkspaceBytes, kernel.options));
  const size_t w_elems = static_cast<size_t>(s.n) * s.k;
  const int copies = static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(absl::GetFlag(FLAGS_chain),
                                           (kChainBytes + w_elems * 2 - 1) / (w_elems * 2))));
  std::vector<DeviceBuffer<__nv_bfloat16>> weights;
  for (int c = 0; c < copies; ++c) {
    ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> w, RandomBf16Buffer(w_elems, 7 + c));
    weights.push_back(std::move(w));
  }
  ASSIGN_OR_RETURN(auto x, RandomBf16Buffer(static_cast<size_t>(rows) * s.k, 3));
  const bool silu_mul = s.epilogue == GemmEpilogue::kSiluMul;
  const int y_cols = silu_mul ? s.n / 2 : s.n;
  ASSIGN_OR_RETURN(auto y_bf16,
                   DeviceBuffer<__nv_bfloat16>::Create(s.f32_output ? 0 : rows * y_cols));
  ASSIGN_OR_RETURN(auto y_f32, DeviceBuffer<float>::Create(s.f32_output ? rows * s.n : 0));
  GemmArgs args;
  args.m = rows;
  args.n = s.n;
  args.k = s.k;
  args.x = x.data();
  args.y_bf16 = s.f32_output ? nullptr : y_bf16.data();
  args.y_f32 = s.f32_output ? y_f32.data() : nullptr;
  args.epilogue = s.epilogue;
  auto run = [&](int copy) {
    GemmArgs a = args;
    a.w = weights[copy % copies].data();
    return gemm->Run(a, stream);
  };
  if (kernel.tune) {  // timed over the chain's weight copies, as a model's layers
    std::vector<const __nv_bfloat16*> copies_w;
    for (const auto& w : weights) copies_w.push_back(w.data());
    GemmArgs a = args;
    a.w = copies_w[0];
    RETURN_IF_ERROR(gemm->Tune(a, stream, copies_w));
  }
  const int chain = absl::GetFlag(FLAGS_chain), reps = absl::GetFlag(FLAGS_reps);
  ASSIGN_OR_RETURN(const std::vector<double> chains,
                   TimeEnqueued(stream, 1, reps, [&]() -> absl::Status {
                     for (int i = 0; i < chain; ++i) RETURN_IF_ERROR(run(i));
                     return absl::OkStatus();
                   }));
  ASSIGN_OR_RETURN(const std::vector<double> hot,
                   TimeEnqueued(stream, 1, reps, [&]() -> absl::Status {
                     for (int i = 0; i < chain; ++i) RETURN_IF_ERROR(run(0));
                     return absl::OkStatus();
                   }));
  std::vector<double> singles;
  for (int r = 0; r < reps; ++r) {
    RETURN_IF_ERROR(flush.Run(stream));
    ASSIGN_OR_RETURN(const std::vector<double> one,
                     TimeEnqueued(stream, 0, 1, [&]() { return run(r); }));
    singles.push_back(one[0]);
  }
  const double bytes =
      2.0 * w_elems + 2.0 * rows * s.k + (s.f32_output ? 4.0 : 2.0) * rows * y_cols;
  const double floor_us = bytes / ceilings.copy_bandwidth * 1e6;
  const double chain_us = Median(chains) / chain * 1e6, single_us = Median(singles) * 1e6;
  ASSIGN_OR_RETURN(const std::string algorithm, gemm->DescribePlan(args));
  return nlohmann::json{{"gemm", s.name},
                        {"algorithm", algorithm},
                        {"n", s.n},
                        {"k", s.k},
                        {"rows", rows},
                        {"kernel", kernel.name},
                        {"chain_us", chain_us},
                        {"single_us", single_us},
                        {"hot_us", Median(hot) / chain * 1e6},
                        {"floor_us", floor_us},
                        {"chain_ratio", chain_us / floor_us},
                        {"single_ratio", single_us / floor_us},
                        {"chain_bytes_per_s", bytes / (chain_us * 1e-6)}};
}

absl::Status Main() {
  const int tp = absl::GetFlag(FLAGS_tp);
  if (tp < 1) return absl::InvalidArgumentError("--tp must be >= 1");
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(const GpuCeilings ceilings, MeasureGpuCeilings(stream));
  ASSIGN_OR_RETURN(L2Flush flush, L2Flush::Create());
  // Llama-3-8B: hidden 4096, 32 q / 8 kv heads of 128, MLP 14336, vocabulary 128256.
  const Shape shapes[] = {{"qkv", (32 + 2 * 8) * 128 / tp, 4096, false},
                          {"o_proj", 4096, 32 * 128 / tp, false},
                          {"gate_up", 2 * 14336 / tp, 4096, false},
                          {"gate_silu", 2 * 14336 / tp, 4096, false, GemmEpilogue::kSiluMul},
                          {"down", 4096, 14336 / tp, false},
                          {"lm_head", (128256 + tp - 1) / tp, 4096, true}};
  std::vector<Kernel> kernels = {
      {"cublaslt", {.skinny_max_rows = 0}, /*tune=*/true},  // its leading candidates timed
      {"cublaslt_first", {.skinny_max_rows = 0}},           // the heuristic's first
      {"few_row", {.skinny_max_rows = kSkinnyMaxRows, .dependent_launch = false}},
      {"few_row_shallow",
       {.skinny_max_rows = kSkinnyMaxRows, .dependent_launch = true, .skinny_deep = false}},
      {"few_row_pdl", {.skinny_max_rows = kSkinnyMaxRows}}};
  for (int c = 1; c < absl::GetFlag(FLAGS_cublas_candidates); ++c) {
    kernels.push_back(
        {absl::StrCat("cublaslt#", c + 1), {.skinny_max_rows = 0, .cublas_candidate = c}});
  }
  std::printf("%s: copy %.3g B/s; tp %d\n", ceilings.device.c_str(), ceilings.copy_bandwidth, tp);
  std::printf("%8s %5s %6s %15s %9s %9s %9s %9s %7s %7s %6s\n", "gemm", "n", "k", "kernel", "rows",
              "chain_us", "single_us", "hot_us", "floor", "chain×", "TB/s");
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& r : absl::GetFlag(FLAGS_rows)) {
    const int rows = std::stoi(r);
    for (const Shape& s : shapes) {
      for (const Kernel& kernel : kernels) {
        if (s.epilogue != GemmEpilogue::kNone && kernel.options.skinny_max_rows == 0) continue;
        absl::StatusOr<nlohmann::json> result = RunCase(s, rows, kernel, ceilings, flush, stream);
        if (absl::IsUnimplemented(result.status()) && kernel.options.cublas_candidate > 0) {
          std::printf("%8s %5d %6d %15s %9d  (%s)\n", s.name, s.n, s.k, kernel.name.c_str(), rows,
                      std::string(result.status().message()).c_str());
          continue;  // fewer candidates for this shape
        }
        RETURN_IF_ERROR(result.status());
        nlohmann::json& j = *result;
        std::printf(
            "%8s %5d %6d %15s %9d %9.2f %9.2f %9.2f %7.2f %7.2f %6.2f  %s\n", s.name, s.n, s.k,
            kernel.name.c_str(), rows, j["chain_us"].get<double>(), j["single_us"].get<double>(),
            j["hot_us"].get<double>(), j["floor_us"].get<double>(), j["chain_ratio"].get<double>(),
            j["chain_bytes_per_s"].get<double>() / 1e12, j["algorithm"].get<std::string>().c_str());
        std::fflush(stdout);
        results.push_back(std::move(j));
      }
    }
  }
  WriteBenchJson(absl::GetFlag(FLAGS_json), ceilings, results, {{"tp", tp}});
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec::gpu

int main(int argc, char** argv) {
  return treespec::gpu::BenchMain(
      argc, argv, "treespec-gemm-bench",
      "The GEMMs of a verify step (few rows, Llama-3-8B weights) against their memory floor.",
      treespec::gpu::Main);
}
