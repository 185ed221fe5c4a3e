// bf16 GEMMs through cuBLASLt: y = x · wᵀ (+ bias), the Linear layers of the CUDA backend.
// CPU reference: MatMul then AddBias (common/model/cpu_ops.h).
//
// Plan/run split: the first call for a shape builds its matmul descriptor, matrix layouts and
// heuristic algorithm (a "plan") and keeps it; later calls with that shape only set the bias
// pointer and enqueue cublasLtMatmul on the caller's stream with the runner's preallocated
// workspace: no device allocation, no heuristic query, no synchronisation, so the call can be
// captured in a CUDA graph. Build the plans a graph will need before capturing it (Prepare, or
// one eager Run per shape; an eager run also loads the kernel's module). Host code only
// (gemm.cc), but the header stays C++17-clean so .cu files may include it.
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
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace treespec::gpu {

// cuBLAS's advice for Hopper (sm_90) is a 32 MiB workspace; older GPUs need 4 MiB at most.
inline constexpr size_t kDefaultGemmWorkspaceBytes = size_t{32} << 20;

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
};

// OK, or InvalidArgument naming the bad value: m, n, k >= 1; k % 8 == 0 (so every row of x
// and w starts 16-byte aligned, which the tensor-core kernels need); x, w and the output
// non-null and 16-byte aligned, bias too when given; exactly one output; no bias with the fp32
// output. The last rule follows cuBLASLt: its bias epilogue reads the bias in the output's
// type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: "same type as the elements of output
// matrix" except for int8 and fp8 kernels), so a bf16 bias with fp32 output is not a supported
// combination; no model we load has a bias on its fp32-output GEMM (the LM head). Host-only:
// reads no device memory.
absl::Status ValidateGemmArgs(const GemmArgs& args);

// Owns a cuBLASLt handle, one workspace and the plans of the shapes it has run, for the device
// current at Create (make that device current for every later call). Not thread-safe, and
// every Run shares the one workspace: use one runner per stream (or per thread), or order the
// streams so that no two of its GEMMs overlap.
class GemmRunner {
 public:
  // A runner whose GEMMs may use up to `workspace_bytes` of scratch (0: none, which rules out
  // split-K algorithms; kDefaultGemmWorkspaceBytes is the usual choice).
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(size_t workspace_bytes);

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

  int plan_count() const { return static_cast<int>(plans_.size()); }
  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct PlanKey {
    int m, n, k;
    bool f32_output, with_bias;
    friend bool operator==(const PlanKey& a, const PlanKey& b) {
      return a.m == b.m && a.n == b.n && a.k == b.k && a.f32_output == b.f32_output &&
             a.with_bias == b.with_bias;
    }
    template <typename H>
    friend H AbslHashValue(H h, const PlanKey& key) {
      return H::combine(std::move(h), key.m, key.n, key.k, key.f32_output, key.with_bias);
    }
  };
  struct Plan;  // descriptors + algorithm, defined in gemm.cc

  GemmRunner(cublasLtHandle_t handle, DeviceBuffer<unsigned char> workspace);
  absl::StatusOr<Plan*> GetOrCreatePlan(const PlanKey& key);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_GEMM_H_
