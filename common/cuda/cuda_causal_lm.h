// The CUDA backend of CausalLm (DESIGN §5–6): bf16 weights and KV cache, fp32 accumulation,
// cuBLASLt GEMMs and our kernels for the rest, on one GPU or tensor-parallel over several.
//
// Tensor parallelism (Megatron layout, tp_plan.h: any rank count up to the q heads, uneven
// splits): each rank is a ModelShard (model_shard.h: the per-layer math is there) on its own
// GPU, driven from its own thread (RankThreads), with an NCCL communicator: one all-reduce
// after o_proj and one after down_proj (fused with the residual add and norm into one
// peer-access kernel where the GPUs allow it), a vocab-parallel embedding and LM head. The page
// table (PagedKvCache) is one, shared by every rank's KV pool. The host prepares each chunk's
// metadata once; every rank uploads it, so the ranks never wait on each other on the host.
//
// All device memory is allocated at creation: the weights, the KV pools, activations for
// `max_rows` rows and the attention's work space. A Forward with more new nodes than that runs
// in chunks of rows (a later chunk sees the earlier chunks' K/V like a drafter's first_new).
// Forward returns the logits on the host, as the interface says (the test and fallback path);
// VerifyStep keeps the logits on the GPUs: choice, walk and KV commit run there and only the
// accepted paths come back. Greedy rows under tp > 1 exchange only (max, id) per rank.
// Not thread-safe: Forward, VerifyStep, Commit and Truncate from one thread at a time.
//
// Numerics against the fp32 CPU reference: weights, activations and the residual stream are
// bf16 (rounded after every op), so logits agree to bf16-level error, not bit for bit; tp > 1
// rounds each rank's partial sum to bf16 before the all-reduce, so it agrees with tp = 1 to
// the same level. A CUDA or NCCL error in the middle of a tensor-parallel step may leave the
// other ranks waiting in a collective: the model is then unusable (the error is returned).
#ifndef TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_
#define TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/gemm.h"
#include "common/cuda/tree_attention_plan.h"
#include "common/cuda/weight_source.h"
#include "common/model/causal_lm.h"
#include "common/model/config.h"
#include "common/model/weights.h"

namespace treespec::gpu {

struct CudaLmOptions {
  // The GPU of each tensor-parallel rank (size options.tensor_parallel, distinct ordinals);
  // empty: tensor_parallel consecutive ordinals from `device`.
  std::vector<int> devices;
  int device = 0;
  int max_rows = 2048;  // new nodes per internal forward chunk (activation buffers)
  // tp > 1: the all-reduce + residual + norm as one kernel over peer access when every pair of
  // GPUs has it (peer_all_reduce.h); false, or without peer access: NCCL then a norm kernel.
  bool peer_all_reduce = true;
  // tp == 1: forwards replay CUDA graphs per bucket of rows (captured at the second use of a
  // bucket); false runs every kernel eagerly.
  bool cuda_graphs = true;
  // Which GEMM kernels the shards use (the few-row kernel for verify steps by default).
  GemmOptions gemm;
  // Tree attention's query rows per CTA: 0 = per launch (AutoTileRows), or 64 / 128.
  int attention_tile_rows = 0;
  // The tree attention as a programmatic dependent launch (TreeAttentionOptions).
  bool attention_dependent_launch = true;
  // Split attention tiles merged by their last CTA up to this many valid rows × splits
  // (TreeAttentionOptions::fused_merge_row_splits; 0: all by the merge launch).
  int attention_fused_merge_row_splits = kAttnDefaultFusedMergeRowSplits;
  // The tree attention's wgmma path where it exists (TreeAttentionOptions::wgmma).
  bool attention_wgmma = true;
  // How attention key ranges are split (TreeAttentionOptions::proportional_splits).
  bool attention_proportional_splits = true;
  // One CTA per SM where that shortens the launch (TreeAttentionOptions::plan_by_critical_path).
  bool attention_plan_by_critical_path = true;
};

// Builds the model from full fp32 host weights (each rank converts its slice to bf16 on its
// GPU). KV pools as the CPU backend sizes them. INVALID_ARGUMENT for bad options, shapes or a
// device list that does not match options.tensor_parallel; UNAVAILABLE without usable devices
// or NCCL; RESOURCE_EXHAUSTED when the GPU memory is too small.
absl::StatusOr<std::unique_ptr<CausalLm>> CreateCudaCausalLm(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const LmOptions& options,
                                                             const CudaLmOptions& cuda = {});

// The same model with pseudo-random weights made on the device (benchmarks of real shapes:
// an 8B-shaped model without 32 GB of host tensors), of `style` (weight_source.h).
absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCudaCausalLm(
    const ModelConfig& config, uint64_t seed, const LmOptions& options,
    const CudaLmOptions& cuda = {}, RandomStyle style = RandomStyle::kSpread);

// UNIMPLEMENTED naming the first layer whose blocks (LayerSpecOf) this backend has no kernels
// for: it runs GQA attention and dense MLPs; MLA and MoE layers run on the CPU backend.
absl::Status CudaSupportsLayers(const ModelConfig& config);

// Loads `model_dir` (config.json, *.safetensors) onto the GPU.
absl::StatusOr<std::unique_ptr<CausalLm>> LoadCudaCausalLm(const std::string& model_dir,
                                                           const LmOptions& options,
                                                           const CudaLmOptions& cuda = {});

// GPU span (first to last operation on the model's stream, ms) of the last VerifyStep of a
// CUDA model (-1 for other backends): with the wall time around the call it gives the host's
// share of a step.
double LastVerifyStepDeviceMs(const CausalLm& model);

// GEMM plans rank 0's runner holds (-1 for other backends). A forward that adds none ran only
// shapes planned before it: tests check that the plans tuned at load are the forward's shapes.
int GemmPlanCount(const CausalLm& model);

// Per-op GPU time of rank 0's forward and step (benchmarks: where the time goes). With timing
// on, every op is followed by an event (a little slower); TakeOpTimes returns (op, ms) summed
// since the last call, ops in forward order. FAILED_PRECONDITION for other backends.
absl::Status SetOpTiming(CausalLm& model, bool on);
absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeOpTimes(CausalLm& model);

// Whether a CUDA device is usable here (the services' default backend choice), and how many.
bool CudaDeviceAvailable();
int CudaDeviceCount();

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_CUDA_CAUSAL_LM_H_
