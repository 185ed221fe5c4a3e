// SwiGLU gate on the GPU (bf16 data, fp32 arithmetic). Kernel: kernels/silu_mul.cuh; CPU
// reference: SiluMul (common/model/cpu_ops.h).
#ifndef TREESPEC_COMMON_CUDA_SILU_MUL_H_
#define TREESPEC_COMMON_CUDA_SILU_MUL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// out[i, j] = bf16(silu(gate[i, j]) * up[i, j]), silu(g) = g / (1 + exp(-g)), in fp32.
// in_stride lets gate and up be the two halves of one fused gate_up projection
// ([rows, 2 * cols]: gate = gu, up = gu + cols, in_stride = 2 * cols); in_stride = cols for
// separate contiguous tensors.
//   gate, up  [rows, in_stride] bf16, device (the first cols of each row are read)
//   out       [rows, cols] bf16, device; may be gate or up itself only when in_stride == cols,
//             and must not otherwise overlap them
// Returns cudaErrorInvalidValue for rows < 0, cols < 1 or in_stride < cols (nothing
// launched); cudaSuccess without a launch for rows == 0; else the launch's error.
cudaError_t LaunchSiluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                          int rows, int cols, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_SILU_MUL_H_
