#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/testing/delayed_copy.h"

namespace treespec::gpu::testing {
namespace {

constexpr int kMaxRanges = 4;

struct Ranges {
  CopyRange range[kMaxRanges];
  int count;
};

__global__ void DelayedCopyKernel(const Ranges ranges, uint64_t delay_ns) {
  kernels::AllowDependentLaunch();
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < delay_ns);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int r = 0; r < ranges.count; ++r) {
    uint4* dst = static_cast<uint4*>(ranges.range[r].dst);
    const uint4* src = static_cast<const uint4*>(ranges.range[r].src);
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
         i < ranges.range[r].bytes / 16; i += stride) {
      dst[i] = src[i];
    }
  }
}

}  // namespace

cudaError_t LaunchDelayedCopy(absl::Span<const CopyRange> ranges, int delay_us,
                              cudaStream_t stream) {
  if (ranges.size() > kMaxRanges || delay_us < 0) return cudaErrorInvalidValue;
  Ranges arg = {};
  for (const CopyRange& r : ranges) {
    if (r.bytes % 16 != 0 || reinterpret_cast<uintptr_t>(r.dst) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(r.src) % 16 != 0) {
      return cudaErrorInvalidValue;
    }
    arg.range[arg.count++] = r;
  }
  DelayedCopyKernel<<<132, 256, 0, stream>>>(arg, static_cast<uint64_t>(delay_us) * 1000);
  return cudaGetLastError();
}

}  // namespace treespec::gpu::testing
