// Launching a kernel as a programmatic dependent of the stream's previous kernel (sm_90+): it
// may start once every CTA of that kernel called AllowDependentLaunch, so its prologue overlaps
// that kernel's end; it must call WaitForPriorGrid before reading that kernel's output
// (kernels/common.cuh). For .cu launchers only (the C++ form of cudaLaunchKernelEx).
#ifndef TREESPEC_COMMON_CUDA_DEPENDENT_LAUNCH_H_
#define TREESPEC_COMMON_CUDA_DEPENDENT_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace treespec::gpu::internal {

// `kernel<<<grid, block, shared_bytes, stream>>>(args...)`, with the programmatic stream
// serialization attribute when `dependent`.
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeDependent(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t shared_bytes, bool dependent, cudaStream_t stream,
                                 Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace treespec::gpu::internal

#endif  // TREESPEC_COMMON_CUDA_DEPENDENT_LAUNCH_H_
