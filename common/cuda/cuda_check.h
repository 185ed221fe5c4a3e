// CUDA runtime errors as absl::Status (STYLE rule 3). Usable from host .cc files and from .cu
// files compiled by nvcc.
//
//   absl::Status Upload(...) {
//     CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
//     CUDA_RETURN_IF_ERROR(LaunchRmsNorm(...));  // launchers return cudaError_t too
//     return absl::OkStatus();
//   }
#ifndef TREESPEC_COMMON_CUDA_CUDA_CHECK_H_
#define TREESPEC_COMMON_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace treespec::gpu {

// The status for `error` raised by `expr` at file:line; OK for cudaSuccess. The code says what
// a caller can do about it: out of memory -> kResourceExhausted, a bad argument ->
// kInvalidArgument, no usable device or driver -> kUnavailable, anything else -> kInternal.
inline absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file,
                                      int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorName(error),
                                     " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace treespec::gpu

// Returns a non-OK absl::Status (with the expression, file and line) from the enclosing
// function when `expr`, a cudaError_t, is not cudaSuccess.
#define CUDA_RETURN_IF_ERROR(expr)                                                                \
  do {                                                                                            \
    const cudaError_t treespec_cuda_error_ = (expr);                                              \
    if (treespec_cuda_error_ != cudaSuccess) {                                                    \
      return ::treespec::gpu::CudaErrorToStatus(treespec_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                             \
  } while (0)

#endif  // TREESPEC_COMMON_CUDA_CUDA_CHECK_H_
