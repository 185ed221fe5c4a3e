#include "common/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/launch_util.h"
#include "common/cuda/skinny_gemm.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

// The status for cuBLAS status `status` raised by `expr` at file:line, coded as
// CudaErrorToStatus does: allocation -> kResourceExhausted, a bad value -> kInvalidArgument,
// no usable library or GPU -> kUnavailable, no algorithm for the request -> kUnimplemented,
// anything else -> kInternal.
absl::Status CublasStatusToStatus(cublasStatus_t status, const char* expr, const char* file,
                                  int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message =
      absl::StrCat(file, ":", line, ": ", expr, ": ", cublasLtGetStatusName(status), " (",
                   cublasLtGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnavailableError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

#define CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                 \
    const cublasStatus_t treespec_cublas_status_ = (expr);                             \
    if (treespec_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                            \
      return CublasStatusToStatus(treespec_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

// Every pointer is promised 16-byte alignment (ValidateGemmArgs), and the heuristic is told no
// more, so a plan's algorithm suits every call of its shape whatever the buffers' addresses.
constexpr uint32_t kMinAlignmentBytes = 16;

// The heuristic reads the bias pointer's value (never what it points to) to learn its
// alignment; at plan time it is given this address, aligned to 16 bytes and no more, for the
// same reason. Run sets the real pointer before every launch.
const void* const kBiasAlignmentProbe = reinterpret_cast<const void*>(uintptr_t{16});

absl::Status ValidateShape(int m, int n, int k) {
  if (m < 1) return absl::InvalidArgumentError(absl::StrCat("GEMM m=", m, ": must be >= 1"));
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("GEMM n=", n, ": must be >= 1"));
  if (k < 1) return absl::InvalidArgumentError(absl::StrCat("GEMM k=", k, ": must be >= 1"));
  if (k % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM k=", k, ": must be a multiple of 8 (16-byte rows of x and w)"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePointer(const void* p, const char* name) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat("GEMM ", name, " is null"));
  if (!internal::Aligned16(p)) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM ", name, "=0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                                   ": must be 16-byte aligned"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                          const T& value) {
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  return absl::OkStatus();
}

template <typename T>
absl::Status SetPreference(cublasLtMatmulPreference_t preference,
                           cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
  return absl::OkStatus();
}

struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};

}  // namespace

// Everything cublasLtMatmul needs for one shape except the data pointers (and the bias
// pointer, set per call).
struct GemmRunner::Plan {
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destroy errors have no one to report to.
    if (y_layout != nullptr) cublasLtMatrixLayoutDestroy(y_layout);
    if (x_layout != nullptr) cublasLtMatrixLayoutDestroy(x_layout);
    if (w_layout != nullptr) cublasLtMatrixLayoutDestroy(w_layout);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr;  // cuBLAS's A
  cublasLtMatrixLayout_t x_layout = nullptr;  // cuBLAS's B
  cublasLtMatrixLayout_t y_layout = nullptr;  // cuBLAS's C and D
  cublasLtMatmulAlgo_t algo = {};
  float waves = 0;    // the heuristic's estimate of the algorithm's waves of CTAs
  int candidate = 0;  // the heuristic's candidate kept (0: its first)
  int timed = 0;      // candidates timed to choose it (0: untimed)
  // The few-row kernel's plan instead (no cuBLASLt descriptors then).
  bool skinny = false;
  SkinnyGemmShape skinny_shape;
};

namespace {
// The few-row kernel's scratch: split partials of 64 rows × 64 outputs for up to 1024 CTAs (two
// per SM on 512 SMs), and the counters of up to 16k split tiles.
constexpr size_t kSkinnyPartialFloats = size_t{1024} * 64 * 64;
constexpr int kSkinnyCounters = 16384;
}  // namespace

absl::Status ValidateGemmArgs(const GemmArgs& args) {
  RETURN_IF_ERROR(ValidateShape(args.m, args.n, args.k));
  RETURN_IF_ERROR(ValidatePointer(args.x, "x"));
  RETURN_IF_ERROR(ValidatePointer(args.w, "w"));
  if ((args.y_bf16 == nullptr) == (args.y_f32 == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM needs exactly one output, y_bf16 or y_f32; got ",
                     args.y_bf16 == nullptr ? "neither" : "both"));
  }
  if (args.y_bf16 != nullptr) RETURN_IF_ERROR(ValidatePointer(args.y_bf16, "y_bf16"));
  if (args.y_f32 != nullptr) RETURN_IF_ERROR(ValidatePointer(args.y_f32, "y_f32"));
  if (args.bias != nullptr) {
    if (args.y_f32 != nullptr) {
      return absl::InvalidArgumentError(
          "GEMM bias with the fp32 output y_f32: cuBLASLt's bias epilogue reads the bias in the "
          "output's type, so a bf16 bias needs the bf16 output y_bf16 (add the bias separately "
          "for fp32 logits)");
    }
    RETURN_IF_ERROR(ValidatePointer(args.bias, "bias"));
  }
  if (args.epilogue == GemmEpilogue::kSiluMul) {
    if (args.n % 2 != 0 || args.y_bf16 == nullptr || args.bias != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GEMM with the SiLU·mul epilogue: needs an even n (gate rows then up rows; got n=",
          args.n, "), the bf16 output y_bf16 and no bias"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(size_t workspace_bytes,
                                                               const GemmOptions& options) {
  if (options.skinny_max_rows < 0 || options.skinny_max_rows > kSkinnyMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("GemmOptions::skinny_max_rows ",
                                                   options.skinny_max_rows, ": must be in [0, ",
                                                   kSkinnyMaxRows, "]"));
  }
  // Device memory first: if it fails, no handle is left behind.
  ASSIGN_OR_RETURN(DeviceBuffer<unsigned char> workspace,
                   DeviceBuffer<unsigned char>::Create(workspace_bytes));
  const bool skinny = options.skinny_max_rows > 0;
  ASSIGN_OR_RETURN(DeviceBuffer<float> partials,
                   DeviceBuffer<float>::Create(skinny ? kSkinnyPartialFloats : 0));
  ASSIGN_OR_RETURN(DeviceBuffer<int> counters,
                   DeviceBuffer<int>::Create(skinny ? kSkinnyCounters : 0));
  int device = 0, num_sms = 0, deep_ctas_per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  if (skinny) {
    RETURN_IF_ERROR(counters.ZeroNow());
    CUDA_RETURN_IF_ERROR(ConfigureSkinnyGemm(&deep_ctas_per_sm));
  }
  cublasLtHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  return std::unique_ptr<GemmRunner>(new GemmRunner(handle, std::move(workspace), options, num_sms,
                                                    deep_ctas_per_sm, std::move(partials),
                                                    std::move(counters)));
}

GemmRunner::GemmRunner(cublasLtHandle_t handle, DeviceBuffer<unsigned char> workspace,
                       const GemmOptions& options, int num_sms, int deep_ctas_per_sm,
                       DeviceBuffer<float> partials, DeviceBuffer<int> counters)
    : handle_(handle),
      workspace_(std::move(workspace)),
      options_(options),
      num_sms_(num_sms),
      deep_ctas_per_sm_(options.skinny_deep ? deep_ctas_per_sm : 0),
      partials_(std::move(partials)),
      counters_(std::move(counters)) {}

GemmRunner::~GemmRunner() {
  plans_.clear();  // their descriptors before the handle
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::Status GemmRunner::Prepare(int m, int n, int k, bool f32_output, bool with_bias) {
  RETURN_IF_ERROR(ValidateShape(m, n, k));
  if (with_bias && f32_output) {
    return absl::InvalidArgumentError("GEMM bias with the fp32 output: not supported (gemm.h)");
  }
  return GetOrCreatePlan(PlanKey{m, n, k, f32_output, with_bias}).status();
}

absl::StatusOr<GemmRunner::Plan*> GemmRunner::GetOrCreatePlan(const PlanKey& key,
                                                              const TuneInputs* tune_on) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (key.m <= options_.skinny_max_rows) {
    const SkinnyGemmShape shape =
        PlanSkinnyGemm(key.n, key.k, key.silu_mul, num_sms_, partials_.size(),
                       static_cast<int>(counters_.size()), deep_ctas_per_sm_);
    if (shape.splits > 0) {
      auto plan = std::make_unique<Plan>();
      plan->skinny = true;
      plan->skinny_shape = shape;
      Plan* const raw = plan.get();
      plans_.emplace(key, std::move(plan));
      return raw;
    }
  }

  // cuBLASLt is column-major, and row-major y[m, n] is column-major yᵀ [n, m]:
  //   yᵀ = w · xᵀ, where row-major w[n, k] is column-major [k, n] (ld k) taken transposed, and
  //   row-major x[m, k] is column-major xᵀ [k, m] (ld k) as it is.
  // So cuBLAS's (m, n, k) is our (n, m, k), A = w with op T, B = x with op N, C = D = y (ld n),
  // and the bias, one per row of D, is one per output feature, as wanted.
  auto plan = std::make_unique<Plan>();
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  RETURN_IF_ERROR(SetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_T}));
  RETURN_IF_ERROR(SetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_N}));
  if (key.with_bias) {
    RETURN_IF_ERROR(SetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                 static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS)));
    RETURN_IF_ERROR(SetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                 static_cast<int32_t>(CUDA_R_16BF)));
    RETURN_IF_ERROR(
        SetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, kBiasAlignmentProbe));
  }
  const uint64_t m = key.m, n = key.n, k = key.k;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->w_layout, CUDA_R_16BF, k, n, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->x_layout, CUDA_R_16BF, k, m, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan->y_layout, key.f32_output ? CUDA_R_32F : CUDA_R_16BF, n, m, n));

  cublasLtMatmulPreference_t raw_preference = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_preference));
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter> preference(
      raw_preference);
  RETURN_IF_ERROR(SetPreference(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                static_cast<uint64_t>(workspace_.bytes())));
  for (const cublasLtMatmulPreferenceAttributes_t attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    RETURN_IF_ERROR(SetPreference(preference.get(), attribute, kMinAlignmentBytes));
  }
  // Split-K partial sums stay fp32 (in the workspace): the other schemes reduce them in the
  // output type, i.e. in bf16 for bf16 outputs, which would break the fp32 accumulation that
  // DESIGN §5 promises. Algorithms without split-K (scheme NONE) are always allowed.
  RETURN_IF_ERROR(SetPreference(preference.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)));

  // The heuristic's candidates come fastest first by its own estimate. Kept: the one
  // options_.cublas_candidate names, else (Tune) the fastest of the leading ones timed on
  // tune_on's buffers, else the first.
  const bool tune =
      options_.cublas_candidate <= 0 && options_.cublas_tune_candidates > 1 && tune_on != nullptr;
  const int want = std::max(0, options_.cublas_candidate);
  std::vector<cublasLtMatmulHeuristicResult_t> results(tune ? options_.cublas_tune_candidates
                                                            : want + 1);
  int found = 0;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->desc, plan->w_layout, plan->x_layout, plan->y_layout, plan->y_layout,
      preference.get(), static_cast<int>(results.size()), results.data(), &found));
  if (found <= want || results[want].state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt has ", found, " algorithm(s), not the ", want + 1,
                     " wanted, for the GEMM m=", key.m, " n=", key.n, " k=", key.k, " output ",
                     key.f32_output ? "fp32" : "bf16", key.with_bias ? " with bias" : "",
                     " within a workspace of ", workspace_.bytes(), " bytes"));
  }
  int kept = want;
  if (tune && found > 1) {
    results.resize(found);
    ASSIGN_OR_RETURN(kept, TimeCandidates(*plan, results, *tune_on));
    plan->timed = found;
  }
  plan->algo = results[kept].algo;
  plan->waves = results[kept].wavesCount;
  plan->candidate = kept;
  Plan* const raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status GemmRunner::Tune(const GemmArgs& args, cudaStream_t stream,
                              absl::Span<const __nv_bfloat16* const> weights) {
  RETURN_IF_ERROR(ValidateGemmArgs(args));
  for (const __nv_bfloat16* w : weights) RETURN_IF_ERROR(ValidatePointer(w, "w to tune on"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(
        "GemmRunner::Tune under stream capture: it runs and waits; tune before capturing");
  }
  const bool silu_mul = args.epilogue == GemmEpilogue::kSiluMul;
  // (A SiLU·mul shape is the few-row kernel's or refused by Run: nothing to time.)
  const TuneInputs inputs{&args, weights, stream};
  return GetOrCreatePlan(
             PlanKey{args.m, args.n, args.k, args.y_f32 != nullptr, args.bias != nullptr, silu_mul},
             silu_mul ? nullptr : &inputs)
      .status();
}

absl::StatusOr<std::string> GemmRunner::DescribePlan(const GemmArgs& args) const {
  auto it = plans_.find(PlanKey{args.m, args.n, args.k, args.y_f32 != nullptr, args.bias != nullptr,
                                args.epilogue == GemmEpilogue::kSiluMul});
  if (it == plans_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no GEMM plan for m=", args.m, " n=", args.n, " k=", args.k));
  }
  const Plan& plan = *it->second;
  if (plan.skinny) return std::string("few-row kernel");
  auto config = [&](cublasLtMatmulAlgoConfigAttributes_t attribute) {
    int32_t value = -1;  // (-1: cuBLASLt does not report it)
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, attribute, &value, sizeof(value), &written);
    return value;
  };
  return absl::StrCat(
      "algo ", config(CUBLASLT_ALGO_CONFIG_ID), " tile ", config(CUBLASLT_ALGO_CONFIG_TILE_ID),
      " stages ", config(CUBLASLT_ALGO_CONFIG_STAGES_ID), " split-k ",
      config(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), " waves ", plan.waves, ", candidate ",
      plan.candidate + 1, plan.timed > 0 ? absl::StrCat(" of ", plan.timed, " timed") : "");
}

absl::StatusOr<int> GemmRunner::TimeCandidates(
    Plan& plan, const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
    const TuneInputs& tune) {
  const cudaStream_t stream = tune.stream;
  // The timed runs cycle through the weights, from one the warm-up did not just read: at least
  // 5 runs, and one per weight matrix.
  const absl::Span<const __nv_bfloat16* const> weights =
      tune.weights.empty() ? absl::MakeConstSpan(&tune.args->w, 1) : tune.weights;
  const int timed_runs = std::max(5, static_cast<int>(weights.size()));
  constexpr float kMargin = 0.98f;  // another candidate must beat the first by 2 %
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
    }
  } events;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&events.start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&events.stop));
  // ms of timed_runs back-to-back runs of plan.algo, after one to warm up.
  GemmArgs args = *tune.args;
  auto time_algo = [&]() -> absl::StatusOr<float> {
    args.w = weights[0];
    RETURN_IF_ERROR(RunCublas(plan, args, stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.start, stream));
    for (int r = 1; r <= timed_runs; ++r) {
      args.w = weights[r % weights.size()];
      RETURN_IF_ERROR(RunCublas(plan, args, stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events.stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events.start, events.stop));
    return ms;
  };
  int best = 0;
  float first_ms = 0, best_ms = 0;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    plan.algo = candidates[i].algo;
    absl::StatusOr<float> ms = time_algo();
    if (i == 0) {
      RETURN_IF_ERROR(ms.status());  // the first must run
      first_ms = best_ms = *ms;
      continue;
    }
    // A later candidate that cuBLASLt refuses to enqueue is passed over; a device error is not.
    if (!ms.ok()) {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      continue;
    }
    if (*ms < kMargin * first_ms && *ms < best_ms) {
      best = i;
      best_ms = *ms;
    }
  }
  return best;
}

absl::Status GemmRunner::RunCublas(const Plan& plan, const GemmArgs& args, cudaStream_t stream) {
  if (args.bias != nullptr) {
    // A host-side write into the descriptor: nothing is enqueued or allocated.
    RETURN_IF_ERROR(SetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                 static_cast<const void*>(args.bias)));
  }
  // Host scalars: read when the kernel is enqueued (and baked into a captured graph).
  const float alpha = 1.0f, beta = 0.0f;  // beta = 0: y is not read, its old contents may be NaN
  const bool f32_output = args.y_f32 != nullptr;
  void* const y = f32_output ? static_cast<void*>(args.y_f32) : static_cast<void*>(args.y_bf16);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan.desc, &alpha, args.w, plan.w_layout, args.x,
                                        plan.x_layout, &beta, y, plan.y_layout, y, plan.y_layout,
                                        &plan.algo, workspace_.data(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

absl::Status GemmRunner::Run(const GemmArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateGemmArgs(args));
  const bool f32_output = args.y_f32 != nullptr;
  const bool silu_mul = args.epilogue == GemmEpilogue::kSiluMul;
  ASSIGN_OR_RETURN(Plan* const plan, GetOrCreatePlan(PlanKey{args.m, args.n, args.k, f32_output,
                                                             args.bias != nullptr, silu_mul}));
  if (silu_mul && !plan->skinny) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM with the SiLU·mul epilogue: m=", args.m, " n=", args.n,
                     " is not a few-row shape (m <= ", options_.skinny_max_rows,
                     " rows and n/2 <= 512k outputs); run the GEMM and LaunchSiluMul instead"));
  }
  if (plan->skinny) {
    CUDA_RETURN_IF_ERROR(LaunchSkinnyGemm(args, plan->skinny_shape, partials_.data(),
                                          counters_.data(), options_.dependent_launch, stream));
    return absl::OkStatus();
  }
  return RunCublas(*plan, args, stream);
}

}  // namespace treespec::gpu
