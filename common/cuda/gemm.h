// bf16 GEMMs: y = x · wᵀ (+ bias), the Linear layers of the CUDA backend. Up to
// GemmOptions::skinny_max_rows rows (a verify step's) go to our own weight-streaming kernel
// (skinny_gemm.h); more rows (prefill) go to cuBLASLt. CPU reference: MatMul then AddBias
// (common/model/cpu_ops.h).
//
// Plan/run split: the first call for a shape builds its matmul descriptor, matrix layouts and
// algorithm (a "plan") and keeps it; later calls with that shape only set the bias pointer and
// enqueue cublasLtMatmul on the caller's stream with the runner's preallocated workspace: no
// device allocation, no heuristic query, no synchronisation, so the call can be captured in a
// CUDA graph. The algorithm: Run and Prepare take the heuristic's first; Tune, called once per
// shape before serving (ModelShard does it at load for its graph buckets), times the
// heuristic's leading candidates on the call's buffers, cycling through every weight matrix of
// the shape as a forward does, and keeps the fastest (GemmOptions::cublas_tune_candidates; it
// waits for the stream). Build the plans a graph will need before capturing it (one eager Run
// per shape; it also loads the kernel's module). Host code only (gemm.cc), but the header
// stays C++17-clean so .cu files may include it.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<GemmRunner> gemm,
//                    GemmRunner::Create(kDefaultGemmWorkspaceBytes));
//   RETURN_IF_ERROR(gemm->Run({.m = tokens, .n = out_features, .k = in_features, .x = x,
//                              .w = w, .bias = b, .y_bf16 = y}, stream));
#ifndef TREESPEC_COMMON_CUDA_GEMM_H_
#define TREESPEC_COMMON_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/device_buffer.h"

namespace treespec::gpu {

// cuBLAS's advice for Hopper (sm_90) is a 32 MiB workspace; older GPUs need 4 MiB at most.
inline constexpr size_t kDefaultGemmWorkspaceBytes = size_t{32} << 20;

// What a GEMM does to x · wᵀ before storing it.
enum class GemmEpilogue {
  kNone,  // y = x · wᵀ (+ bias)
  // The SwiGLU gate of a fused gate/up projection: w is [gate rows; up rows] ([2f, k], n = 2f)
  // and y_bf16 [m, f] = SiLU(x · w_gateᵀ) ⊙ (x · w_upᵀ) from the fp32 sums, rounded once. The
  // few-row kernel only (GemmRunner::FewRows(m)); no bias.
  kSiluMul,
};

// One GEMM, y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n] on every row), bf16 inputs, fp32
// products and accumulation, one rounding to the output type. All pointers are device
// pointers, 16-byte aligned, and y must not overlap x, w or bias.
struct GemmArgs {
  int m = 0;  // rows of x and y (tokens)
  int n = 0;  // rows of w, columns of y (out_features)
  int k = 0;  // columns of x and w (in_features); a multiple of 8 (16-byte rows)
  const __nv_bfloat16* x = nullptr;     // [m, k] row-major
  const __nv_bfloat16* w = nullptr;     // [n, k] row-major: a Hugging Face Linear weight
  const __nv_bfloat16* bias = nullptr;  // [n], or nullptr; only with a bf16 output (see below)
  // Exactly one output: y_bf16 for activations, y_f32 for logits.
  __nv_bfloat16* y_bf16 = nullptr;  // [m, n] row-major
  float* y_f32 = nullptr;           // [m, n] row-major
  GemmEpilogue epilogue = GemmEpilogue::kNone;
};

// OK, or InvalidArgument naming the bad value: m, n, k >= 1; k % 8 == 0 (so every row of x
// and w starts 16-byte aligned, which the tensor-core kernels need); x, w and the output
// non-null and 16-byte aligned, bias too when given; exactly one output; no bias with the fp32
// output. The last rule follows cuBLASLt: its bias epilogue reads the bias in the output's
// type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: "same type as the elements of output
// matrix" except for int8 and fp8 kernels), so a bf16 bias with fp32 output is not a supported
// combination; no model we load has a bias on its fp32-output GEMM (the LM head). kSiluMul
// needs an even n, the bf16 output and no bias. Host-only: reads no device memory.
absl::Status ValidateGemmArgs(const GemmArgs& args);

// Which kernels a runner uses (benchmarks compare them; the defaults are the fast choice).
struct GemmOptions {
  // GEMMs of at most this many rows (0 .. 64) run the few-row kernel; 0: cuBLASLt for all. Up to 16
  // rows the kernel ties cuBLASLt on the H200, at 32 a lone GEMM is slower, at 64 much slower
  // (treespec-gemm-bench; docs/experiments/README.md, 'few-row GEMM'). 32 keeps a 16-node tree plus
  // its root (17 rows) on the kernel (fused SiLU·mul, overlapped launch) and on the same
  // batch-invariant sums as plain decoding (1 row): with 16, speculative and plain greedy split at
  // more near-ties (engine_gpu_test).
  int skinny_max_rows = 32;
  // The few-row kernel launches as a programmatic dependent of the stream's previous kernel.
  bool dependent_launch = true;
  // Shapes whose few-row grid is small (at most two CTAs per SM on the H200: the QKV and output
  // projections of an 8B model) run the deep pipeline (skinny_gemm.h); false: never.
  bool skinny_deep = true;
  // GemmRunner::Tune of a cuBLASLt shape times this many of the heuristic's leading candidates
  // (each run once to warm up, then back to back through the shape's weights: at least 5 runs)
  // and keeps the fastest, the first unless another is 2 % faster; 0 or 1: the heuristic's first,
  // untimed. Timing pays because the heuristic's first choice is not always its fastest: for the
  // 64-row gate/up, down and LM-head GEMMs of an 8B model on the H200 it is 3–9 % slower than the
  // best candidate (docs/experiments/README.md, 'cuBLASLt's candidates timed at load').
  int cublas_tune_candidates = 8;
  // Benchmarks: i > 0 = always the heuristic's (i + 1)-th candidate, untimed even by Tune (a
  // shape with fewer candidates is UNIMPLEMENTED); 0 = the first, or as Tune finds.
  int cublas_candidate = 0;
};

// Owns a cuBLASLt handle, one workspace and the plans of the shapes it has run, for the device
// current at Create (make that device current for every later call). Not thread-safe, and
// every Run shares the one workspace: use one runner per stream (or per thread), or order the
// streams so that no two of its GEMMs overlap.
class GemmRunner {
 public:
  // A runner whose GEMMs may use up to `workspace_bytes` of scratch (0: none, which rules out
  // split-K algorithms; kDefaultGemmWorkspaceBytes is the usual choice).
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(size_t workspace_bytes,
                                                            const GemmOptions& options = {});

  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues the GEMM on `stream` (validated as by ValidateGemmArgs first). The first call for
  // a shape (m, n, k, output type, bias or not) builds its plan; see the file comment.
  // Returns InvalidArgument for bad arguments, the mapped cuBLASLt status otherwise (an
  // asynchronous kernel fault shows up later, at the stream's next synchronisation).
  absl::Status Run(const GemmArgs& args, cudaStream_t stream);

  // Builds the plan for a shape without running it: for every shape a CUDA graph will contain
  // before capturing it. OK if the plan exists already.
  absl::Status Prepare(int m, int n, int k, bool f32_output, bool with_bias);

  // Builds the plan for `args`' shape as Run would, except that a cuBLASLt shape gets the
  // fastest of the heuristic's leading candidates, timed on these buffers (y is written, and
  // the call waits for `stream`). `weights`: every weight matrix of this shape that a forward
  // streams (a model's layers), which the timed runs cycle through as a forward does, so that
  // weights L2 holds alone but not together are timed from memory (empty: args.w alone). Not
  // under stream capture (FAILED_PRECONDITION). OK, and nothing run, if the plan exists
  // already: call it before the first Run of the shape. Too slow for the request path (an 8B
  // model's gate/up: ~16 ms), so models call it at load.
  absl::Status Tune(const GemmArgs& args, cudaStream_t stream,
                    absl::Span<const __nv_bfloat16* const> weights = {});

  // Whether GEMMs of m rows run the few-row kernel (and so may use GemmEpilogue::kSiluMul).
  bool FewRows(int m) const { return m <= options_.skinny_max_rows; }

  int plan_count() const { return static_cast<int>(plans_.size()); }
  // What runs the GEMM of `args`' shape, once it has a plan (Run or Prepare): "few-row
  // kernel", or cuBLASLt's algorithm id, tile, stages and split-K factor with the heuristic's
  // wave count and which candidate was kept. NOT_FOUND without a plan.
  absl::StatusOr<std::string> DescribePlan(const GemmArgs& args) const;
  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct PlanKey {
    int m, n, k;
    bool f32_output, with_bias;
    bool silu_mul = false;
    friend bool operator==(const PlanKey& a, const PlanKey& b) {
      return a.m == b.m && a.n == b.n && a.k == b.k && a.f32_output == b.f32_output &&
             a.with_bias == b.with_bias && a.silu_mul == b.silu_mul;
    }
    template <typename H>
    friend H AbslHashValue(H h, const PlanKey& key) {
      return H::combine(std::move(h), key.m, key.n, key.k, key.f32_output, key.with_bias,
                        key.silu_mul);
    }
  };
  struct Plan;  // descriptors + algorithm, defined in gemm.cc

  GemmRunner(cublasLtHandle_t handle, DeviceBuffer<unsigned char> workspace,
             const GemmOptions& options, int num_sms, int deep_ctas_per_sm,
             DeviceBuffer<float> partials, DeviceBuffer<int> counters);
  // What Tune times the candidates on.
  struct TuneInputs {
    const GemmArgs* args;
    absl::Span<const __nv_bfloat16* const> weights;  // (empty: args->w)
    cudaStream_t stream;
  };
  // `tune_on`: where to time the heuristic's candidates (null: take its first).
  absl::StatusOr<Plan*> GetOrCreatePlan(const PlanKey& key, const TuneInputs* tune_on = nullptr);
  absl::Status RunCublas(const Plan& plan, const GemmArgs& args, cudaStream_t stream);
  // The index among `candidates` of the fastest (see cublas_tune_candidates).
  absl::StatusOr<int> TimeCandidates(Plan& plan,
                                     const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                                     const TuneInputs& tune);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
  const GemmOptions options_;
  const int num_sms_;
  const int deep_ctas_per_sm_;    // 0: no deep pipeline (PlanSkinnyGemm)
  DeviceBuffer<float> partials_;  // the few-row kernel's split-K partial sums
  DeviceBuffer<int> counters_;    // its per-tile arrival counters (zero between launches)
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_GEMM_H_
