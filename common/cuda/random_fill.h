// Pseudo-random bf16 values generated on the device: the random-weight models of benchmarks
// (an 8B-shaped model is filled in place in well under a second instead of being made on the
// host). Not for tests that compare against the CPU (use testing::RandomWeights there).
#ifndef TREESPEC_COMMON_CUDA_RANDOM_FILL_H_
#define TREESPEC_COMMON_CUDA_RANDOM_FILL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// out[i] = bf16(center + half_width * (2u - 1)) with u in [0, 1) a hash of (seed, i): uniform
// in [center - half_width, center + half_width], the same values for the same seed.
// Returns cudaErrorInvalidValue for n < 0 or a null out with n > 0; else the launch's error.
cudaError_t LaunchFillUniformBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float center,
                                  float half_width, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_RANDOM_FILL_H_
