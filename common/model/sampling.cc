// Token choice at a tree node (DESIGN §3 step 3). Everything here is a pure function of its
// inputs, so the GPU path can reproduce it exactly:
//
//  * UniformAt(seed, position): Philox-4x32-10 (Salmon et al., SC'11) with key = seed
//    (low word, high word) and counter = (position low, position high, 0, 0). The first two
//    output words give 53 bits: u = ((out0 << 21) ^ (out1 >> 11)) * 2^-53, in [0, 1).
//  * ChooseToken, temperature <= 0: argmax, lowest id among equal maxima.
//  * ChooseToken, temperature > 0:
//     1. z = logits / temperature;
//     2. top-k (k > 0): keep the k largest z, ties broken by lower id;
//     3. p = softmax over the kept tokens (double precision);
//     4. top-p (< 1): order the kept tokens by (p descending, id ascending) and keep the
//        shortest prefix whose mass reaches top_p (always at least one token);
//     5. inverse CDF over the kept tokens in increasing id order: the first id whose
//        cumulative mass exceeds u * (kept mass), u = UniformAt(seed, position).
#include "common/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace treespec {
namespace {

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Philox-4x32-10 block function.
void Philox4x32(uint32_t counter[4], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMul0, counter[0], &hi0, &lo0);
    MulHiLo(kMul1, counter[2], &hi1, &lo1);
    const uint32_t c0 = hi1 ^ counter[1] ^ key0;
    const uint32_t c1 = lo1;
    const uint32_t c2 = hi0 ^ counter[3] ^ key1;
    const uint32_t c3 = lo0;
    counter[0] = c0;
    counter[1] = c1;
    counter[2] = c2;
    counter[3] = c3;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

double UniformAt(uint64_t seed, int64_t position) {
  const uint64_t pos = static_cast<uint64_t>(position);
  uint32_t counter[4] = {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), 0, 0};
  Philox4x32(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits53 = (static_cast<uint64_t>(counter[0]) << 21) ^ (counter[1] >> 11);
  return static_cast<double>(bits53) * 0x1.0p-53;
}

int32_t ChooseToken(absl::Span<const float> logits, const SamplingConfig& config,
                    int64_t position) {
  if (config.temperature <= 0.0f || logits.size() == 1) return Argmax(logits);
  const int vocab = static_cast<int>(logits.size());
  const double inv_t = 1.0 / config.temperature;

  // Kept tokens, in increasing id order once step 4 is done.
  std::vector<int32_t> kept(vocab);
  std::iota(kept.begin(), kept.end(), 0);
  auto before = [&](int32_t a, int32_t b) {  // larger logit first, then lower id
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (config.top_k > 0 && config.top_k < vocab) {
    std::nth_element(kept.begin(), kept.begin() + config.top_k, kept.end(), before);
    kept.resize(config.top_k);
  }

  double max_z = -INFINITY;
  for (int32_t id : kept) max_z = std::max(max_z, logits[id] * inv_t);
  std::vector<double> prob(vocab, 0.0);  // unnormalised; only kept ids are set
  double total = 0.0;
  std::sort(kept.begin(), kept.end());
  for (int32_t id : kept) {
    prob[id] = std::exp(logits[id] * inv_t - max_z);
    total += prob[id];
  }

  if (config.top_p < 1.0f) {
    std::sort(kept.begin(), kept.end(), before);  // same order as by prob, ties by id
    const double target = static_cast<double>(config.top_p) * total;
    double mass = 0.0;
    size_t keep = 0;
    while (keep < kept.size() && (keep == 0 || mass < target)) mass += prob[kept[keep++]];
    kept.resize(keep);
    std::sort(kept.begin(), kept.end());
    total = 0.0;
    for (int32_t id : kept) total += prob[id];
  }

  const double threshold = UniformAt(config.seed, position) * total;
  double cumulative = 0.0;
  for (int32_t id : kept) {
    cumulative += prob[id];
    if (cumulative > threshold) return id;
  }
  return kept.back();  // rounding left threshold at the very top
}

}  // namespace treespec
