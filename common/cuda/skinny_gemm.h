// Launcher of the few-row GEMM (kernels/skinny_gemm.cuh): y = x · wᵀ (+ bias) for m <= 64 rows,
// streaming w at close to the memory bandwidth. GemmRunner (gemm.h) uses it for such shapes;
// call it directly only through GemmRunner, which validates the arguments, plans the split and
// owns the partials and counters.
#ifndef TREESPEC_COMMON_CUDA_SKINNY_GEMM_H_
#define TREESPEC_COMMON_CUDA_SKINNY_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/cuda/gemm.h"

namespace treespec::gpu {

// The most rows of x the kernel takes (in tiles of 8: m <= 8, 16, 24, 32, 64).
inline constexpr int kSkinnyMaxRows = 64;

// The grid of one GEMM: a CTA per tile of 64 outputs (w rows; 32 gate + 32 up rows for
// kSiluMul) and per split of k.
struct SkinnyGemmShape {
  int tiles = 0;
  int k_steps = 0;        // of 64 columns
  int splits = 0;         // 0: the shape does not fit the scratch (use another kernel)
  bool silu_mul = false;  // GemmEpilogue::kSiluMul
  bool deep = false;      // the deep pipeline (kernels/skinny_gemm.cuh: SkinnyDeepStages)
};

// The shape for (n, k) (silu_mul: GemmEpilogue::kSiluMul) on a GPU of `num_sms` SMs: splits so
// that there are about two CTAs per SM (the kernel fits four, so the grid is one wave whenever
// the tiles alone are at most that), each with at least four steps; splits = 0 when the
// partials of 64 rows would not fit `partial_floats` or a split GEMM's tiles exceed
// `max_counters`. The deep pipeline when the whole grid fits `deep_ctas_per_sm` CTAs per SM
// (ConfigureSkinnyGemm; 0: never). Depends on n and k only (never on m), so the order of every
// row's sum does not depend on how many rows there are (the pipeline depth does not change it
// either).
SkinnyGemmShape PlanSkinnyGemm(int n, int k, bool silu_mul, int num_sms, size_t partial_floats,
                               int max_counters, int deep_ctas_per_sm);

// Allows the kernel's shared memory on the current device; once per device, before any launch.
// Sets *deep_ctas_per_sm to how many CTAs of the deep pipeline fit an SM (0 where a block may not
// have its 96 KiB).
cudaError_t ConfigureSkinnyGemm(int* deep_ctas_per_sm);

// Enqueues the GEMM (args validated by ValidateGemmArgs, m <= kSkinnyMaxRows). `partials`
// holds PlanSkinnyGemm's partial_floats; `counters` its max_counters ints, zero before the
// first launch (each launch leaves them zero). `dependent_launch`: launch as a programmatic
// dependent of the stream's previous kernel (the first weight stages load while it finishes).
cudaError_t LaunchSkinnyGemm(const GemmArgs& args, const SkinnyGemmShape& shape, float* partials,
                             int* counters, bool dependent_launch, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_SKINNY_GEMM_H_
