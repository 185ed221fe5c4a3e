// The CUDA backend of CausalLm (DESIGN §5): bf16 weights and KV cache on one GPU, fp32
// accumulation, cuBLASLt GEMMs and our kernels for the rest (embedding, residual + RMSNorm,
// QKV → RoPE → paged K/V write, tree attention, SiLU·mul, KV commit).
//
// One layer, per forward:
//   x  += out (previous sublayer; the first layer starts from the embedding)
//   h   = RMSNorm(x)                        LaunchRmsNorm (residual fused)
//   qkv = h · [Wq; Wk; Wv]ᵀ (+ bias)        one GEMM on the concatenated projection
//   q, K/V cache = RoPE(qkv) at the nodes' positions and slots     LaunchKvWrite
//   a   = tree attention(q) over the prefix and the tree           TreeAttention
//   out = a · Woᵀ;  x += out;  h = RMSNorm(x)
//   out = (SiLU(h · Wgateᵀ) * (h · Wupᵀ)) · Wdownᵀ   gate and up as one GEMM
// then logits = RMSNorm(x) · headᵀ in fp32.
//
// All device memory is allocated at creation: the weights, the KV pool, activations for
// `max_rows` rows and the attention's work space. A Forward with more new nodes than that runs
// in chunks of rows (a later chunk sees the earlier chunks' K/V like a drafter's first_new).
// Forward returns the logits on the host, as the interface says; that copy is the test and
// fallback path (the fused verify step that keeps logits on the GPU comes on top of this).
// Not thread-safe: Forward, Commit and Truncate from one thread at a time.
//
// Numerics against the fp32 CPU reference: weights, activations and the residual stream are
// bf16 (rounded after every op), so logits agree to bf16-level error, not bit for bit.
#ifndef TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_
#define TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/model/weights.h"

namespace treespec::gpu {

struct CudaLmOptions {
  int device = 0;       // CUDA device ordinal
  int max_rows = 2048;  // new nodes per internal forward chunk (activation buffers)
};

// Builds the model on `cuda.device` from full fp32 host weights (converted to bf16 there).
// options.tensor_parallel must be 1 (NCCL tensor parallelism is a separate backend step).
// KV pool as the CPU backend sizes it. INVALID_ARGUMENT for bad options or shapes;
// UNAVAILABLE without a usable device; RESOURCE_EXHAUSTED when the GPU memory is too small.
absl::StatusOr<std::unique_ptr<CausalLm>> CreateCudaCausalLm(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const LmOptions& options,
                                                             const CudaLmOptions& cuda = {});

// The same model with pseudo-random weights made on the device (benchmarks of real shapes:
// an 8B-shaped model without 32 GB of host tensors), with testing::RandomWeights' spreads.
absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCudaCausalLm(const ModelConfig& config,
                                                                   uint64_t seed,
                                                                   const LmOptions& options,
                                                                   const CudaLmOptions& cuda = {});

// Loads `model_dir` (config.json, *.safetensors) onto the GPU.
absl::StatusOr<std::unique_ptr<CausalLm>> LoadCudaCausalLm(const std::string& model_dir,
                                                           const LmOptions& options,
                                                           const CudaLmOptions& cuda = {});

// GPU span (first to last operation on the model's stream, ms) of the last VerifyStep of a
// CUDA model (-1 for other backends): with the wall time around the call it gives the host's
// share of a step.
double LastVerifyStepDeviceMs(const CausalLm& model);

// Whether a CUDA device is usable here (the services' default backend choice).
bool CudaDeviceAvailable();

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_
