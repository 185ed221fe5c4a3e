#include "bench/gpu_ceilings.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/gemm.h"
#include "common/cuda/nccl_communicator.h"
#include "common/model/communicator.h"
#include "common/util/rank_threads.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

constexpr size_t kCopyBytes = size_t{1} << 30;  // 1 GiB each way
constexpr int kGemmSize = 8192;                 // m = n = k
constexpr int kWarmups = 2;
constexpr int kTimedReps = 10;

// Two CUDA events for one timed interval, destroyed with the object.
class EventPair {
 public:
  EventPair() = default;
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  absl::Status Create() {
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return absl::OkStatus();
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// The shortest of kTimedReps stream-timed runs of `enqueue`, in seconds, after kWarmups
// untimed ones. The best run, not the mean: a ceiling.
absl::StatusOr<double> BestSeconds(cudaStream_t stream,
                                   const std::function<absl::Status()>& enqueue) {
  ASSIGN_OR_RETURN(const std::vector<double> seconds,
                   TimeEnqueued(stream, kWarmups, kTimedReps, enqueue));
  return *std::min_element(seconds.begin(), seconds.end());
}

}  // namespace

absl::StatusOr<std::vector<double>> TimeEnqueued(cudaStream_t stream, int warmups, int reps,
                                                 const std::function<absl::Status()>& enqueue) {
  for (int i = 0; i < warmups; ++i) RETURN_IF_ERROR(enqueue());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  EventPair events;
  RETURN_IF_ERROR(events.Create());
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.start(), stream));
    RETURN_IF_ERROR(enqueue());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.stop(), stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events.stop()));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events.start(), events.stop()));
    seconds.push_back(ms * 1e-3);
  }
  return seconds;
}

absl::StatusOr<DeviceBuffer<__nv_bfloat16>> RandomBf16Buffer(size_t count, uint32_t seed) {
  ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> buffer, DeviceBuffer<__nv_bfloat16>::Create(count));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<__nv_bfloat16> block(std::min(count, size_t{1} << 20));
  for (__nv_bfloat16& v : block) v = __float2bfloat16_rn(uniform(rng));
  for (size_t offset = 0; offset < count; offset += block.size()) {
    const size_t n = std::min(block.size(), count - offset);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer.data() + offset, block.data(), n * sizeof(__nv_bfloat16),
                                    cudaMemcpyHostToDevice));
  }
  // Pageable copies may return before their DMA lands; callers use non-blocking streams.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return buffer;
}

absl::StatusOr<double> MeasureCopyBandwidth(cudaStream_t stream) {
  ASSIGN_OR_RETURN(DeviceBuffer<unsigned char> src,
                   DeviceBuffer<unsigned char>::Create(kCopyBytes));
  ASSIGN_OR_RETURN(DeviceBuffer<unsigned char> dst,
                   DeviceBuffer<unsigned char>::Create(kCopyBytes));
  RETURN_IF_ERROR(src.FillBytes(0x5A, stream));
  const auto copy = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(const double seconds, BestSeconds(stream, copy));
  return 2.0 * static_cast<double>(kCopyBytes) / seconds;  // read + write
}

absl::StatusOr<double> MeasureBf16GemmRate(GemmRunner& gemm, cudaStream_t stream) {
  const size_t count = static_cast<size_t>(kGemmSize) * kGemmSize;
  ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> x, RandomBf16Buffer(count, 1));
  ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> w, RandomBf16Buffer(count, 2));
  ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> y, DeviceBuffer<__nv_bfloat16>::Create(count));
  GemmArgs args;
  args.m = args.n = args.k = kGemmSize;
  args.x = x.data();
  args.w = w.data();
  args.y_bf16 = y.data();
  ASSIGN_OR_RETURN(const double seconds,
                   BestSeconds(stream, [&]() { return gemm.Run(args, stream); }));
  return 2.0 * kGemmSize * kGemmSize * static_cast<double>(kGemmSize) / seconds;
}

absl::StatusOr<double> MeasureAllReduceSeconds(int tp, size_t elements, int reps) {
  std::vector<int> devices(tp);
  std::iota(devices.begin(), devices.end(), 0);
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms,
                   CreateNcclCommunicators(devices));
  std::vector<absl::Status> status(tp);
  double seconds = 0;
  RankThreads threads(tp);
  // Rank r's timed loop on `stream` (its device current).
  auto time_rank = [&](int r, cudaStream_t stream) -> absl::Status {
    EventPair events;
    RETURN_IF_ERROR(events.Create());
    ASSIGN_OR_RETURN(DeviceBuffer<__nv_bfloat16> data,
                     DeviceBuffer<__nv_bfloat16>::Create(std::max<size_t>(elements, 1)));
    RETURN_IF_ERROR(data.FillBytes(0, stream));
    for (int i = 0; i < reps + 20; ++i) {
      if (i == 20) CUDA_RETURN_IF_ERROR(cudaEventRecord(events.start(), stream));
      RETURN_IF_ERROR(comms[r]->AllReduceSum(data.data(), elements, CommType::kBFloat16, stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.stop(), stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events.start(), events.stop()));
    if (r == 0) seconds = ms * 1e-3 / reps;
    return absl::OkStatus();
  };
  threads.Run([&](int r) {
    cudaStream_t stream = nullptr;
    cudaError_t e = cudaSetDevice(devices[r]);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      status[r] = absl::InternalError(absl::StrCat("all-reduce timing: ", cudaGetErrorString(e)));
      return;
    }
    status[r] = time_rank(r, stream);
    cudaStreamDestroy(stream);
  });
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return seconds;
}

absl::StatusOr<GpuCeilings> MeasureGpuCeilings(cudaStream_t stream) {
  GpuCeilings c;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  cudaDeviceProp properties;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  c.device = properties.name;
  ASSIGN_OR_RETURN(c.copy_bandwidth, MeasureCopyBandwidth(stream));
  ASSIGN_OR_RETURN(std::unique_ptr<GemmRunner> gemm,
                   GemmRunner::Create(kDefaultGemmWorkspaceBytes));
  ASSIGN_OR_RETURN(c.bf16_gemm_rate, MeasureBf16GemmRate(*gemm, stream));
  return c;
}

void WriteBenchJson(const std::string& path, const GpuCeilings& ceilings,
                    const nlohmann::json& results, const nlohmann::json& extra) {
  if (path.empty()) return;
  nlohmann::json doc = {{"device", ceilings.device},
                        {"copy_bandwidth_bytes_per_s", ceilings.copy_bandwidth},
                        {"bf16_gemm_flops_per_s", ceilings.bf16_gemm_rate},
                        {"results", results}};
  if (extra.is_object()) doc.update(extra);
  std::ofstream(path) << doc.dump(2) << "\n";
}

int BenchMain(int argc, char** argv, const char* name, const char* usage, absl::Status (*run)()) {
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  if (const absl::Status status = run(); !status.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace treespec::gpu
