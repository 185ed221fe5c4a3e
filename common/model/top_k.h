// A row's next-token distribution reduced to its best candidates (what a drafter needs): the
// log-softmax of a logits row and its top k entries. The CPU reference of the GPU kernel
// LaunchTopKLogProbs (common/cuda/top_k_logprobs.h) and of CausalLm::ForwardTopK.
#ifndef TREESPEC_COMMON_MODEL_TOP_K_H_
#define TREESPEC_COMMON_MODEL_TOP_K_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace treespec {

struct TokenLogProb {
  int32_t token = 0;
  float logprob = 0.0f;  // log p(token | prefix) at temperature 1, <= 0
};

// out[i] = logits[i] - logsumexp(logits): max, then a double sum of exp(float(x - max)) in id
// order, lse = max + float(log(sum)). [vocab] -> [vocab]
void LogSoftmax(absl::Span<const float> logits, absl::Span<float> out);

// The top min(k, finite entries) entries of `logprobs` [vocab], descending, lower token id first
// on ties; non-finite entries (-inf, NaN) are never taken. k <= 0: none.
std::vector<TokenLogProb> TopKLogProbs(absl::Span<const float> logprobs, int k);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_TOP_K_H_
