#include <cstdint>

#include "common/cuda/choose_token.h"
#include "common/cuda/kernels/choose_token.cuh"
#include "common/cuda/launch_util.h"

namespace treespec::gpu {
namespace {

// A fixed block size per kernel, so a row's work never depends on the batch (DESIGN §3). 512
// threads: 16 warps give the sampling passes enough loads in flight on one SM, and leave room
// for two CTAs per SM.
constexpr int kRowThreads = 512;
constexpr int kCombineThreads = 128;
constexpr int kUniformThreads = 256;

}  // namespace

cudaError_t LaunchChooseToken(const float* logits, int rows, int vocab, const RowSampling* params,
                              int32_t* tokens, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || vocab > kMaxChooseVocab) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || params == nullptr || tokens == nullptr) return cudaErrorInvalidValue;
  kernels::ChooseTokenKernel<kRowThreads>
      <<<rows, kRowThreads, 0, stream>>>(logits, vocab, params, tokens);
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxPartial(const float* logits, int rows, int vocab_slice, int vocab_offset,
                                float* max_out, int32_t* idx_out, cudaStream_t stream) {
  if (rows < 0 || vocab_slice < 1 || vocab_offset < 0 ||
      static_cast<int64_t>(vocab_offset) + vocab_slice > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || idx_out == nullptr) return cudaErrorInvalidValue;
  kernels::ArgmaxPartialKernel<kRowThreads>
      <<<rows, kRowThreads, 0, stream>>>(logits, vocab_slice, vocab_offset, max_out, idx_out);
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxCombine(const float* max_in, const int32_t* idx_in, int ranks, int rows,
                                int32_t* tokens, cudaStream_t stream) {
  if (ranks < 1 || rows < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (max_in == nullptr || idx_in == nullptr || tokens == nullptr) return cudaErrorInvalidValue;
  const int blocks = static_cast<int>(internal::CeilDiv(rows, kCombineThreads));
  kernels::ArgmaxCombineKernel<<<blocks, kCombineThreads, 0, stream>>>(max_in, idx_in, ranks, rows,
                                                                       tokens);
  return cudaGetLastError();
}

cudaError_t LaunchUniformAt(const uint64_t* seeds, const int64_t* positions, int n, double* out,
                            cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (seeds == nullptr || positions == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int blocks = static_cast<int>(internal::CeilDiv(n, kUniformThreads));
  kernels::UniformAtKernel<<<blocks, kUniformThreads, 0, stream>>>(seeds, positions, n, out);
  return cudaGetLastError();
}

}  // namespace treespec::gpu
