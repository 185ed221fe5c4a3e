// Choosing the target's token at a tree node (DESIGN §3 step 3).
#ifndef TREESPEC_COMMON_MODEL_SAMPLING_H_
#define TREESPEC_COMMON_MODEL_SAMPLING_H_

#include <cstdint>

#include "absl/types/span.h"

namespace treespec {

struct SamplingConfig {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: all
  uint64_t seed = 0;
};

// A uniform in [0, 1) from a counter-based generator keyed by (seed, absolute position): the
// same request position draws the same number whether or not speculation ran.
double UniformAt(uint64_t seed, int64_t position);

// Greedy: argmax (lowest id on ties). Otherwise temperature, top-k, top-p, then inverse-CDF
// with UniformAt(seed, position). `logits` [vocab]. Deterministic given its inputs.
int32_t ChooseToken(absl::Span<const float> logits, const SamplingConfig& config,
                    int64_t position);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_SAMPLING_H_
