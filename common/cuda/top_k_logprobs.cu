#include <algorithm>
#include <cstdint>

#include "common/cuda/choose_token.h"
#include "common/cuda/kernels/top_k_logprobs.cuh"
#include "common/cuda/top_k_logprobs.h"

namespace treespec::gpu {
namespace {

// A fixed block size, so a row's work never depends on the batch.
constexpr int kTopKThreads = 256;

}  // namespace

cudaError_t LaunchTopKLogProbs(const float* logits, int rows, int vocab, int k, int32_t* tokens,
                               float* logprobs, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || vocab > kMaxChooseVocab || k < 1 ||
      k > std::min(vocab, kMaxTopKLogProbs)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || tokens == nullptr || logprobs == nullptr) return cudaErrorInvalidValue;
  kernels::TopKLogProbsKernel<kTopKThreads>
      <<<rows, kTopKThreads, 0, stream>>>(logits, vocab, k, tokens, logprobs);
  return cudaGetLastError();
}

}  // namespace treespec::gpu
