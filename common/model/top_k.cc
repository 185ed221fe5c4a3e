#include "common/model/top_k.h"

#include <algorithm>
#include <cmath>

namespace treespec {
namespace {

// Up to this k, TopKLogProbs keeps a sorted list while scanning; beyond, it selects with
// nth_element.
constexpr int kInsertionTopK = 32;

bool Better(const TokenLogProb& a, const TokenLogProb& b) {
  return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
}

}  // namespace

void LogSoftmax(absl::Span<const float> logits, absl::Span<float> out) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  const float lse = max + static_cast<float>(std::log(sum));
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

std::vector<TokenLogProb> TopKLogProbs(absl::Span<const float> logprobs, int k) {
  std::vector<TokenLogProb> top;
  if (k <= 0) return top;
  if (k > kInsertionTopK) {
    // Large k: select in O(V), then sort the k winners.
    top.reserve(logprobs.size());
    for (size_t i = 0; i < logprobs.size(); ++i) {
      if (std::isfinite(logprobs[i])) top.push_back({static_cast<int32_t>(i), logprobs[i]});
    }
    if (static_cast<int>(top.size()) > k) {
      std::nth_element(top.begin(), top.begin() + k, top.end(), Better);
      top.resize(k);
    }
    std::sort(top.begin(), top.end(), Better);
    return top;
  }
  top.reserve(k + 1);
  // Small k: one pass keeping the best k sorted; most entries lose against the k-th at once.
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const float lp = logprobs[i];
    if (!std::isfinite(lp)) continue;
    if (static_cast<int>(top.size()) == k && !(lp > top.back().logprob)) continue;
    const TokenLogProb c{static_cast<int32_t>(i), lp};
    top.insert(std::upper_bound(top.begin(), top.end(), c, Better), c);
    if (static_cast<int>(top.size()) > k) top.pop_back();
  }
  return top;
}

}  // namespace treespec
