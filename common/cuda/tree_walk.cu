#include <cstdint>

#include "common/cuda/kernels/tree_walk.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/tree_walk.h"

namespace treespec::gpu {

cudaError_t LaunchTreeWalk(const int32_t* node_offsets, const int32_t* tokens,
                           const int32_t* parents, const int32_t* choice, int batch, int max_path,
                           int32_t* path, int32_t* path_len, int32_t* emitted,
                           cudaStream_t stream) {
  if (batch < 0 || max_path < 1) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (node_offsets == nullptr || tokens == nullptr || parents == nullptr || choice == nullptr ||
      path == nullptr || path_len == nullptr || emitted == nullptr) {
    return cudaErrorInvalidValue;
  }
  // One thread per request; batches are small, so small blocks spread them over more SMs.
  constexpr int kThreads = 64;
  const int blocks = static_cast<int>(internal::CeilDiv(batch, kThreads));
  kernels::TreeWalkKernel<<<blocks, kThreads, 0, stream>>>(
      node_offsets, tokens, parents, choice, batch, max_path, path, path_len, emitted);
  return cudaGetLastError();
}

}  // namespace treespec::gpu
