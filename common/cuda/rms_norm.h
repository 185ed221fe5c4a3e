// Residual add fused with RMSNorm on the GPU (bf16 data, fp32 arithmetic). Kernel:
// kernels/rms_norm.cuh; CPU reference: AddInPlace then RmsNorm (common/model/cpu_ops.h).
#ifndef TREESPEC_COMMON_CUDA_RMS_NORM_H_
#define TREESPEC_COMMON_CUDA_RMS_NORM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace treespec::gpu {

// For every row i of n elements (Hugging Face LlamaRMSNorm after the residual add):
//   x[i, :]   = bf16(x[i, :] + residual[i, :])           (skipped when residual == nullptr)
//   out[i, :] = bf16(weight * (x[i, :] / sqrt(mean(x[i, :]²) + eps)))
// with the sum and the norm in fp32 and the mean taken over the bf16-rounded x. Without
// residual this is a plain RMSNorm (the first layer's input norm, Qwen3's per-head q/k norms
// with rows = tokens × heads and n = head_dim).
//   x         [rows, n] bf16, device, updated in place when residual != nullptr
//   residual  [rows, n] bf16, device, or nullptr; must not overlap x
//   weight    [n] bf16, device
//   out       [rows, n] bf16, device; may be x itself or residual itself, but must not
//             otherwise overlap them
// Returns cudaErrorInvalidValue for n < 1 or rows < 0 (nothing launched); cudaSuccess without
// a launch for rows == 0; else the launch's error.
cudaError_t LaunchRmsNorm(__nv_bfloat16* x, const __nv_bfloat16* residual,
                          const __nv_bfloat16* weight, int rows, int n, float eps,
                          __nv_bfloat16* out, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_RMS_NORM_H_
