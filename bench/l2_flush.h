// Empties the GPU's L2 cache of a benchmark's operands between timed runs, leaving it full of clean
// lines: a kernel reads a scratch buffer larger than L2. A cudaMemset of a big buffer would evict
// the operands too, but leaves L2 full of dirty lines, so the timed kernel would first pay for
// writing ~50 MiB back to DRAM (about 12 µs on a 60 µs attention launch; measured:
// docs/experiments/README.md, 'a clean L2 flush in the benches'); in a real verify step the kernels
// before the attention or a GEMM mostly read weights.
#ifndef TREESPEC_BENCH_L2_FLUSH_H_
#define TREESPEC_BENCH_L2_FLUSH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace treespec::gpu {

class L2Flush {
 public:
  // `bytes` of scratch (256 MiB: five times the H200's L2), zeroed once. `dirty` makes Run a
  // cudaMemset of the scratch instead, to measure what the dirty lines cost a timed kernel.
  static absl::StatusOr<L2Flush> Create(bool dirty = false, size_t bytes = size_t{256} << 20);

  // Enqueues the read (or the memset) of the whole scratch buffer on `stream`.
  absl::Status Run(cudaStream_t stream);

 private:
  bool dirty_ = false;
  int sms_ = 0;  // of the device current at Create: the read's grid is 4 CTAs per SM
  DeviceBuffer<uint4> scratch_;
  DeviceBuffer<uint32_t> sink_;  // written only if the reads XOR to a value they never do
};

}  // namespace treespec::gpu

#endif  // TREESPEC_BENCH_L2_FLUSH_H_
