#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/rms_norm.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/rms_norm.h"

namespace treespec::gpu {

cudaError_t LaunchRmsNorm(__nv_bfloat16* x, const __nv_bfloat16* residual,
                          const __nv_bfloat16* weight, int rows, int n, float eps,
                          __nv_bfloat16* out, cudaStream_t stream) {
  if (n < 1 || rows < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // One pack per thread up to 1024 threads (hidden 8192 in packs of 8); the block size depends
  // on n only, so a row's reduction order never depends on the batch.
  constexpr int kMaxThreads = 1024;
  const bool vec = n % kernels::kBf16PerPack == 0 && internal::Aligned16(x) &&
                   internal::Aligned16(weight) && internal::Aligned16(out) &&
                   (residual == nullptr || internal::Aligned16(residual));
  if (vec) {
    const int threads = internal::RowBlockThreads(n / kernels::kBf16PerPack, kMaxThreads);
    kernels::AddRmsNormKernel<kernels::kBf16PerPack>
        <<<rows, threads, 0, stream>>>(x, residual, weight, n, eps, out);
  } else {
    const int threads = internal::RowBlockThreads(n, kMaxThreads);
    kernels::AddRmsNormKernel<1><<<rows, threads, 0, stream>>>(x, residual, weight, n, eps, out);
  }
  return cudaGetLastError();
}

}  // namespace treespec::gpu
