// The GPU's ceilings, measured on the machine itself: the floors that benchmarks print next to
// their times (DESIGN §7: floor = max(bytes / bandwidth, FLOPs / GEMM rate)). On an H200 these
// give about 4.24e12 B/s and 690e12 FLOP/s. Each call allocates its own buffers (a few GiB,
// freed on return) and synchronises the stream: for benchmark setup, not for hot paths.
#ifndef TREESPEC_BENCH_GPU_CEILINGS_H_
#define TREESPEC_BENCH_GPU_CEILINGS_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/gemm.h"

namespace treespec::gpu {

// Seconds of each of `reps` runs of `enqueue` (which only enqueues work on `stream`), timed by
// events on the stream, after `warmups` untimed runs; in run order.
absl::StatusOr<std::vector<double>> TimeEnqueued(cudaStream_t stream, int warmups, int reps,
                                                 const std::function<absl::Status()>& enqueue);

// `count` bf16 values uniform in [-1, 1] on the current device: a 1 Mi-element random block,
// tiled. Random rather than constant data, as zeros or repeated values would let the tensor
// cores draw less power (and so clock higher) than real weights do.
absl::StatusOr<DeviceBuffer<__nv_bfloat16>> RandomBf16Buffer(size_t count, uint32_t seed);

// Bytes per second of a 1 GiB device-to-device cudaMemcpyAsync on `stream`, counting the bytes
// read and the bytes written (2 GiB per copy): the best of several timed copies after a
// warm-up. Needs 2 GiB of free device memory.
absl::StatusOr<double> MeasureCopyBandwidth(cudaStream_t stream);

// FLOP/s (2·m·n·k per GEMM) of an 8192 × 8192 × 8192 bf16 GEMM with fp32 accumulation and bf16
// output through `gemm` on `stream`, random inputs: the best of several timed runs after a
// warm-up. Adds that shape's plan to `gemm`. Needs 384 MiB of free device memory.
absl::StatusOr<double> MeasureBf16GemmRate(GemmRunner& gemm, cudaStream_t stream);

// Seconds per in-place bf16 all-reduce of `elements` elements over GPUs 0..tp-1 through the
// NCCL Communicator (one thread per rank), each rank issuing `reps` back to back on its stream
// after a warm-up: the per-collective cost a tensor-parallel forward pays (each of its
// all-reduces is followed by a kernel that needs the result). Rank 0's events time it.
absl::StatusOr<double> MeasureAllReduceSeconds(int tp, size_t elements, int reps = 200);

// Both ceilings of the current device and its name, measured as above (a GemmRunner of its own).
struct GpuCeilings {
  std::string device;
  double copy_bandwidth = 0;  // bytes/s, read + write
  double bf16_gemm_rate = 0;  // FLOP/s
  // max(bytes / bandwidth, flops / GEMM rate) in seconds: DESIGN §7's floor.
  double Floor(double bytes, double flops) const {
    return std::max(bytes / copy_bandwidth, flops / bf16_gemm_rate);
  }
};
absl::StatusOr<GpuCeilings> MeasureGpuCeilings(cudaStream_t stream);

// A benchmark's JSON document: {"device", "copy_bandwidth_bytes_per_s",
// "bf16_gemm_flops_per_s", "results", plus `extra`}, written to `path` unless it is empty.
void WriteBenchJson(const std::string& path, const GpuCeilings& ceilings,
                    const nlohmann::json& results, const nlohmann::json& extra = {});

// A GPU benchmark's main(): sets `usage` as --help's description, parses the flags, runs `run`,
// prints its error as `name: status` and returns the process exit code.
int BenchMain(int argc, char** argv, const char* name, const char* usage, absl::Status (*run)());

}  // namespace treespec::gpu

#endif  // TREESPEC_BENCH_GPU_CEILINGS_H_
