// A drafter's reduction of the logits on the GPU: every row's top-k next-token log-probs
// (temperature 1), so only k (token, log-prob) pairs per row leave the device. Kernel:
// kernels/top_k_logprobs.cuh; CPU reference: LogSoftmax + TopKLogProbs (common/model/top_k.h).
#ifndef TREESPEC_COMMON_CUDA_TOP_K_LOGPROBS_H_
#define TREESPEC_COMMON_CUDA_TOP_K_LOGPROBS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// Largest k of one launch (the ranked keys of a row sit in shared memory).
inline constexpr int kMaxTopKLogProbs = 1024;

// For every row r, the k largest log-probs lp = float(logits[r, id] - lse_r) (descending, lower
// id first on ties, ties of the rounded lp as on the CPU) as
//   tokens[r, j] = id, logprobs[r, j] = lp,
// with lse_r = max + float(log(sum_i exp(double(logits[r, i] - max)))) as the CPU's LogSoftmax
// computes it (the sum in another order, and the device's exp: within a float ulp or two, so
// where the CPU's lse differs, ids of log-probs within that ulp may swap ranks).
// Non-finite logits rank below every finite one (so the first min(k, finite) entries are
// TopKLogProbs' list; the rest carry a non-finite log-prob for the caller to drop). Logits may
// be -inf or NaN but not +inf. One CTA per row; deterministic, and a row's result does not
// depend on the other rows.
//   logits    [rows, vocab] fp32, device (row stride = vocab)
//   tokens    [rows, k] int32, device
//   logprobs  [rows, k] fp32, device
// Returns cudaErrorInvalidValue for rows < 0, vocab < 1, vocab > kMaxChooseVocab
// (choose_token.h), k < 1, k > min(vocab, kMaxTopKLogProbs) or a null pointer with rows > 0
// (nothing launched); cudaSuccess without a launch for rows == 0; else the launch's error.
cudaError_t LaunchTopKLogProbs(const float* logits, int rows, int vocab, int k, int32_t* tokens,
                               float* logprobs, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_TOP_K_LOGPROBS_H_
