#include <algorithm>
#include <cstdint>

#include "common/cuda/dependent_launch.h"
#include "common/cuda/kernels/skinny_gemm.cuh"
#include "common/cuda/launch_util.h"
#include "common/cuda/skinny_gemm.h"

namespace treespec::gpu {
namespace {

template <int kTok, bool kDeep>
constexpr int Stages() {
  return kDeep ? kernels::SkinnyDeepStages<kTok>() : kernels::SkinnyStages<kTok>();
}

template <int kTok, bool kGated, bool kDeep>
cudaError_t Configure() {
  constexpr int kStages = Stages<kTok, kDeep>();
  return cudaFuncSetAttribute(&kernels::SkinnyGemmKernel<kTok, kGated, kStages>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kernels::SkinnySharedBytes<kTok, kStages>());
}

template <bool kDeep>
cudaError_t ConfigureDepth() {
  for (cudaError_t e :
       {Configure<1, false, kDeep>(), Configure<2, false, kDeep>(), Configure<3, false, kDeep>(),
        Configure<4, false, kDeep>(), Configure<8, false, kDeep>(), Configure<1, true, kDeep>(),
        Configure<2, true, kDeep>(), Configure<3, true, kDeep>(), Configure<4, true, kDeep>(),
        Configure<8, true, kDeep>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <int kTok, bool kGated, bool kDeep>
cudaError_t Launch(const kernels::SkinnyGemmArgs& a, const SkinnyGemmShape& shape,
                   bool dependent_launch, cudaStream_t stream) {
  constexpr int kStages = Stages<kTok, kDeep>();
  return internal::LaunchMaybeDependent(
      &kernels::SkinnyGemmKernel<kTok, kGated, kStages>, dim3(shape.tiles, shape.splits),
      dim3(kernels::kSkinnyThreads), kernels::SkinnySharedBytes<kTok, kStages>(), dependent_launch,
      stream, a);
}

template <bool kGated, bool kDeep>
cudaError_t LaunchTok(const kernels::SkinnyGemmArgs& a, int m, const SkinnyGemmShape& shape,
                      bool dependent_launch, cudaStream_t stream) {
  if (m <= 8) return Launch<1, kGated, kDeep>(a, shape, dependent_launch, stream);
  if (m <= 16) return Launch<2, kGated, kDeep>(a, shape, dependent_launch, stream);
  if (m <= 24) return Launch<3, kGated, kDeep>(a, shape, dependent_launch, stream);
  if (m <= 32) return Launch<4, kGated, kDeep>(a, shape, dependent_launch, stream);
  return Launch<8, kGated, kDeep>(a, shape, dependent_launch, stream);
}

template <bool kGated>
cudaError_t LaunchDepth(const kernels::SkinnyGemmArgs& a, int m, const SkinnyGemmShape& shape,
                        bool dependent_launch, cudaStream_t stream) {
  return shape.deep ? LaunchTok<kGated, true>(a, m, shape, dependent_launch, stream)
                    : LaunchTok<kGated, false>(a, m, shape, dependent_launch, stream);
}

}  // namespace

SkinnyGemmShape PlanSkinnyGemm(int n, int k, bool silu_mul, int num_sms, size_t partial_floats,
                               int max_counters, int deep_ctas_per_sm) {
  SkinnyGemmShape shape;
  shape.silu_mul = silu_mul;
  shape.tiles = static_cast<int>(silu_mul ? internal::CeilDiv(n / 2, kernels::kSkinnyRowsW / 2)
                                          : internal::CeilDiv(n, kernels::kSkinnyRowsW));
  shape.k_steps = static_cast<int>(internal::CeilDiv(k, kernels::kSkinnyStepK));
  constexpr int64_t kMinStepsPerSplit = 4;
  const int64_t by_sms = 2 * static_cast<int64_t>(num_sms) / shape.tiles;
  const int64_t splits = std::max<int64_t>(1, std::min(by_sms, shape.k_steps / kMinStepsPerSplit));
  const size_t partials =
      static_cast<size_t>(splits) * shape.tiles * kernels::kSkinnyRowsW * kSkinnyMaxRows;
  if (splits == 1 || (partials <= partial_floats && shape.tiles <= max_counters)) {
    shape.splits = static_cast<int>(splits);
  }
  shape.deep =
      deep_ctas_per_sm > 0 && static_cast<int64_t>(shape.tiles) * std::max(1, shape.splits) <=
                                  static_cast<int64_t>(deep_ctas_per_sm) * num_sms;
  return shape;
}

cudaError_t ConfigureSkinnyGemm(int* deep_ctas_per_sm) {
  *deep_ctas_per_sm = 0;
  if (cudaError_t e = ConfigureDepth<false>(); e != cudaSuccess) return e;
  if (ConfigureDepth<true>() != cudaSuccess) {
    cudaGetLastError();  // a device that allows a block less: no deep pipeline
    return cudaSuccess;
  }
  // The largest deep variant (kTok 8) decides how many fit an SM.
  constexpr int kStages = Stages<8, true>();
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      deep_ctas_per_sm, &kernels::SkinnyGemmKernel<8, false, kStages>, kernels::kSkinnyThreads,
      kernels::SkinnySharedBytes<8, kStages>());
}

cudaError_t LaunchSkinnyGemm(const GemmArgs& args, const SkinnyGemmShape& shape, float* partials,
                             int* counters, bool dependent_launch, cudaStream_t stream) {
  if (args.m < 1 || args.m > kSkinnyMaxRows || shape.splits < 1) {
    return cudaErrorInvalidValue;
  }
  kernels::SkinnyGemmArgs a;
  a.x = args.x;
  a.w = args.w;
  a.bias = args.bias;
  a.y_bf16 = args.y_bf16;
  a.y_f32 = args.y_f32;
  a.m = args.m;
  a.n = args.n;
  a.k = args.k;
  a.tiles = shape.tiles;
  a.k_steps = shape.k_steps;
  a.splits = shape.splits;
  a.partials = partials;
  a.counters = counters;
  if (shape.silu_mul != (args.epilogue == GemmEpilogue::kSiluMul)) return cudaErrorInvalidValue;
  if (shape.silu_mul) return LaunchDepth<true>(a, args.m, shape, dependent_launch, stream);
  return LaunchDepth<false>(a, args.m, shape, dependent_launch, stream);
}

}  // namespace treespec::gpu
