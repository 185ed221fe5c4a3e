#include "common/cuda/kernels/rope.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/rope.h"

namespace treespec::gpu {

cudaError_t LaunchRope(__nv_bfloat16* x, int rows, int num_heads, int head_dim,
                       const int32_t* positions, const float* inv_freq, float attention_factor,
                       cudaStream_t stream) {
  // 12288 floats (48 KiB) is the default dynamic shared memory limit.
  if (rows < 0 || num_heads < 1 || head_dim < 2 || head_dim % 2 != 0 || head_dim > 12288) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int threads = internal::RowBlockThreads(static_cast<int64_t>(num_heads) * head_dim / 2,
                                                /*max_threads=*/256);
  const size_t shared_bytes = sizeof(float) * head_dim;
  kernels::RopeKernel<<<rows, threads, shared_bytes, stream>>>(x, num_heads, head_dim, positions,
                                                               inv_freq, attention_factor);
  return cudaGetLastError();
}

}  // namespace treespec::gpu
