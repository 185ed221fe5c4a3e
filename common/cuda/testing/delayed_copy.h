// A producer for tests of programmatic dependent launches: a kernel that allows its dependents
// to launch at once, then waits `delay_us` and only then copies its byte ranges. A dependent
// kernel that reads those ranges before griddepcontrol.wait sees the old bytes, so a test can
// show that it waits.
#ifndef TREESPEC_COMMON_CUDA_TESTING_DELAYED_COPY_H_
#define TREESPEC_COMMON_CUDA_TESTING_DELAYED_COPY_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/types/span.h"

namespace treespec::gpu::testing {

struct CopyRange {
  void* dst;
  const void* src;
  size_t bytes;  // a multiple of 16; dst and src 16-byte aligned
};

// At most 4 ranges; cudaErrorInvalidValue (nothing launched) otherwise or for misaligned ones.
cudaError_t LaunchDelayedCopy(absl::Span<const CopyRange> ranges, int delay_us,
                              cudaStream_t stream);

}  // namespace treespec::gpu::testing

#endif  // TREESPEC_COMMON_CUDA_TESTING_DELAYED_COPY_H_
