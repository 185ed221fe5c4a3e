// One GPU's share of the CUDA model (DESIGN §5–6): its tensor-parallel slice of the weights
// (Megatron layout, tp_plan.h), its KV heads of every layer, activation buffers for max_rows
// rows, its stream and its NCCL communicator. CudaCausalLm (cuda_causal_lm.h) owns one per rank
// and drives each from that rank's thread; everything here is enqueued on the shard's stream.
//
// The forward of a chunk of rows, per layer (tp = 1 has no all-reduce):
//   x  += out; h = RMSNorm(x)                     LaunchRmsNorm (residual fused)
//   qkv = h · [Wq; Wk; Wv]ᵀ (+ bias)              this rank's heads, one GEMM
//   q, K/V cache = RoPE(qkv)                      LaunchKvWrite
//   a   = tree attention(q)                       TreeAttention (rank's heads)
//   x  += all-reduce(a · Woᵀ); h = RMSNorm(x)                    (row-parallel o_proj)
//   x  += all-reduce((SiLU(h · Wgateᵀ) * (h · Wupᵀ)) · Wdownᵀ); h = next RMSNorm(x)
//                                                  (few rows: SiLU·mul in the GEMM's epilogue)
// with a vocab-parallel embedding (zero rows outside the slice, then an all-reduce) and a
// vocab-parallel LM head: logits [rows, vocab slice] in fp32. Each "all-reduce; add; norm" is
// one PeerReduceGroup kernel when the GPUs have peer access (the GEMM writes its partials into
// the rank's mailbox), else an NCCL all-reduce followed by LaunchRmsNorm.
#ifndef TREESPEC_COMMON_CUDA_MODEL_SHARD_H_
#define TREESPEC_COMMON_CUDA_MODEL_SHARD_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/choose_token.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/gemm.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/peer_all_reduce.h"
#include "common/cuda/pinned_buffer.h"
#include "common/cuda/tree_attention.h"
#include "common/cuda/weight_source.h"
#include "common/model/communicator.h"
#include "common/model/config.h"
#include "common/model/tp_plan.h"

namespace treespec::gpu {

// The ops of a forward and a verify step, for per-op timing (where the time goes).
enum class ShardOp {
  kStart,  // not an op: the mark that begins a timed stretch
  kEmbed,
  kNorm,       // residual add + RMSNorm
  kQkv,        // the QKV GEMM
  kKvWrite,    // RoPE (+ q/k norm) and the paged K/V write
  kAttention,  // tree attention
  kOProj,      // the o_proj GEMM
  kGateUp,     // the gate/up GEMM
  kSiluMul,
  kDown,        // the down_proj GEMM
  kAllReduce,   // tp > 1
  kHead,        // the LM head GEMM
  kChoose,      // token choice (with the logits exchange under tp > 1)
  kWalkCommit,  // accept walk and KV commit
  kCount
};
const char* ShardOpName(ShardOp op);

struct ShardOptions {
  int device = 0;
  int rank = 0;
  int num_pages = 0;  // KV pool pages (the page table is the model's, shared by all ranks)
  int page_size = 16;
  int max_rows = 2048;    // rows per forward chunk
  size_t step_bytes = 0;  // verify-step input buffer (StepInputs)
  int step_rows = 0;      // rows of one verify step (choices)
  size_t step_out_ints = 0;
  // tp == 1: replay each forward as a CUDA graph per bucket of rows (GraphBucketOf: 1, 2, 4, 8,
  // multiples of 8 to 64, of 64 to 512, then eight per doubling); the rows past the real ones
  // compute on a scratch KV slot and are ignored.
  bool cuda_graphs = true;
  GemmOptions gemm;
  int attention_tile_rows = 0;             // TreeAttentionOptions::tile_rows
  bool attention_dependent_launch = true;  // TreeAttentionOptions::dependent_launch
  // TreeAttentionOptions::fused_merge_row_splits
  int attention_fused_merge_row_splits = kAttnDefaultFusedMergeRowSplits;
  bool attention_wgmma = true;                  // TreeAttentionOptions::wgmma
  bool attention_proportional_splits = true;    // TreeAttentionOptions::proportional_splits
  bool attention_plan_by_critical_path = true;  // TreeAttentionOptions::plan_by_critical_path
};

// Where the verify step's inputs lie in step_in() (byte offsets, set by the model).
struct StepLayout {
  size_t params = 0;        // [rows] RowSampling
  size_t tokens = 0;        // [tree rows] drafted tokens, trees packed
  size_t parents = 0;       // [tree rows] parents
  size_t node_offsets = 0;  // [trees + 1]
  size_t committed = 0;     // [trees] committed lengths
  size_t page_offsets = 0;  // [trees + 1]
  size_t page_table = 0;    // page ids
};

class ModelShard {
 public:
  // Makes the rank's weights from `source` and allocates everything on options.device. `peer`
  // (may be null: NCCL all-reduces) must outlive the shard.
  static absl::StatusOr<std::unique_ptr<ModelShard>> Create(
      const ModelConfig& config, const TpPlan& plan, const ShardOptions& options,
      const TensorSource& source, std::unique_ptr<Communicator> comm, PeerReduceGroup* peer);
  ~ModelShard();
  ModelShard(const ModelShard&) = delete;
  ModelShard& operator=(const ModelShard&) = delete;

  int device() const { return options_.device; }
  cudaStream_t stream() const { return stream_; }
  int tensor_parallel() const { return plan_.world_size(); }

  // Makes this shard's device current on the calling thread.
  absl::Status Bind() const;
  // The forward of `rows` rows: `meta` = tokens, positions, KV slots ([3, rows] int32, host
  // memory, copied before this returns) and the attention batch `descs`. Leaves the rank's
  // logits slice [rows, vocab slice] on the device.
  absl::Status Forward(const int32_t* meta, int rows, absl::Span<const AttnSeqDesc> descs);
  // Returns when the last copy out of pinned host memory (Forward's own staging, UploadStep's
  // and CommitPath's sources) is done.
  absl::Status WaitStaged() const;

  // Full logits [rows, vocab] of the last Forward (tp > 1: all-gathered to every rank).
  absl::StatusOr<const float*> FullLogits(int rows);
  // choice()[row0 + r] for rows r of the last Forward, under the RowSampling of row row0 + r
  // in step_in() (UploadStep before the first chunk). When
  // every row is greedy and tp > 1 only (max, id) pairs are exchanged. Every rank computes the
  // same choices, so every rank can walk and commit its own KV heads.
  absl::Status Choose(int row0, int rows, const StepLayout& layout, bool all_greedy);

  // Rank 0, drafting: rows [first, first + rows) of `logits` ([rows, vocab], FullLogits) ranked
  // into rows [slot, slot + rows) of top_tokens() / top_logprobs() ([rows, k] each, slot + rows
  // <= max_rows): their top-k log-probs (LaunchTopKLogProbs, k <= kMaxTopKLogProbs).
  absl::Status RankTopK(const float* logits, int first, int rows, int k, int slot);
  const int32_t* top_tokens() const { return top_tokens_.data(); }
  const float* top_logprobs() const { return top_logprobs_.data(); }

  // Target features (CausalLm::SetFeatureLayers), rank 0: from now on every forward also
  // copies the residual stream after each of `layers` into features(), [max_rows, layers ×
  // hidden] row-major with layer i's block at column i × hidden (the CUDA graphs are recaptured
  // with the copies). Empty: no copies. Other ranks keep none (every rank has the same x).
  absl::Status SetFeatureLayers(const std::vector<int>& layers);
  const __nv_bfloat16* features() const { return features_.data(); }

  // Context rows (CausalLm::AppendContext; the model has a context projection): `rows` rows of
  // config.context_width bf16 values (host memory, copied before this returns) and `meta` =
  // [3, rows] int32 (unused, positions, KV slots; host memory, copied before this returns):
  // c = RMSNorm(rows · fcᵀ), then every layer's QKV GEMM of c and the K/V write of this rank's
  // heads (the q it also makes is dropped). FAILED_PRECONDITION without a projection.
  absl::Status AppendContext(const int32_t* meta, const uint16_t* rows, int num_rows);

  // Copies `bytes` of pinned host memory into step_in().
  absl::Status UploadStep(const void* host, size_t bytes);
  // The accept walk over the packed trees and the KV commit of the accepted paths (all layers,
  // this rank's heads); outputs [path (trees * max_path), path_len (trees), emitted (trees *
  // max_path)] in step_out().
  absl::Status WalkAndCommit(const StepLayout& layout, int num_trees, int max_path);
  const int32_t* step_out() const { return step_out_.data(); }
  const int32_t* choice() const { return choice_.data(); }
  // Per-op timing: when on, every op is followed by an event on the stream (a little slower),
  // and TakeOpTimes returns the GPU ms spent per op (indexed by ShardOp) since the last call.
  absl::Status SetOpTiming(bool on);
  int gemm_plan_count() const { return gemm_->plan_count(); }
  absl::StatusOr<std::vector<double>> TakeOpTimes();

  // Moves the KV of `path` (host commit): meta = [committed_len, path_len, path..., 0, np,
  // pages...] in pinned host memory.
  absl::Status CommitPath(const int32_t* meta, int path_len, int num_pages);

 private:
  ModelShard(const ModelConfig& config, const TpPlan& plan, const ShardOptions& options,
             std::unique_ptr<Communicator> comm, PeerReduceGroup* peer);
  absl::Status Init(const TensorSource& source);
  // Whether forwards replay CUDA graphs (tp == 1 with ShardOptions::cuda_graphs).
  bool UsesGraphs() const;
  // At load: GemmRunner::Tune for every cuBLASLt GEMM of the graph buckets' row counts up to 64
  // (a verify step's), so that no forward waits for it. Forwards without graphs (tp > 1) take
  // cuBLASLt's first candidate for their exact row counts.
  absl::Status TuneGemms();
  absl::Status Layers(int rows);
  // Layers(rows) as a replay of the bucket's CUDA graph (captured after an eager run).
  absl::Status LayersGraph(int rows);
  absl::Status AllReduce(__nv_bfloat16* data, size_t count);
  // Where a row-parallel op writes its partial sums for the next ReduceNorm.
  __nv_bfloat16* Partial();
  // x = (add_residual ? x : 0) + all-reduce(partials); h = RMSNorm(x) · weight.
  absl::Status ReduceNorm(int rows, bool add_residual, const __nv_bfloat16* weight);
  // Records the end of `op` (op timing on).
  void Mark(ShardOp op);

  struct Layer {
    DeviceBuffer<__nv_bfloat16> input_norm;  // [hidden]
    DeviceBuffer<__nv_bfloat16> w_qkv;       // [(q + 2 kv heads of the rank) * head_dim, hidden]
    DeviceBuffer<__nv_bfloat16> b_qkv;       // same rows, or empty
    DeviceBuffer<__nv_bfloat16> q_norm;      // [head_dim] or empty
    DeviceBuffer<__nv_bfloat16> k_norm;      // [head_dim] or empty
    DeviceBuffer<__nv_bfloat16> wo;          // [hidden, rank q heads * head_dim]
    DeviceBuffer<__nv_bfloat16> post_norm;   // [hidden]
    DeviceBuffer<__nv_bfloat16> w_gate_up;   // [2 * rank MLP width, hidden]: gate rows, up rows
    DeviceBuffer<__nv_bfloat16> w_down;      // [hidden, rank MLP width]
  };
  // The GEMMs of layer `w`'s forward of `rows` rows, in the order Layers runs them; Layers and
  // TuneGemms both take them from here, so a tuned plan is the shape a forward runs. The
  // row-parallel ones (o_proj, down) write out_: Layers points them at Partial() as it runs
  // them (with peer reduces, the mailbox moves on at every reduce).
  enum LayerGemm { kQkvGemm, kOProjGemm, kGateUpGemm, kDownGemm, kLayerGemms };
  std::array<GemmArgs, kLayerGemms> LayerGemmArgs(const Layer& w, int rows);
  GemmArgs HeadGemmArgs(int rows);
  // Runs a GEMM of LayerGemmArgs: a rank without MLP columns (k == 0) contributes zeros to the
  // all-reduce; n == 0 runs nothing.
  absl::Status RunLayerGemm(const GemmArgs& args);
  // Layer l's K/V write of `rows` rows from qkv_ (RoPE, q/k norms; q into q_) into its pages.
  cudaError_t WriteKv(int l, int rows, const int32_t* positions, const int32_t* slots);

  const ModelConfig config_;
  const TpPlan plan_;
  const TpRankPlan rank_;
  const ShardOptions options_;
  std::unique_ptr<Communicator> comm_;
  PeerReduceGroup* const peer_;  // null: NCCL all-reduces
  uint64_t peer_epoch_ = 0;      // peer_ calls made (the same count on every rank)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;  // the last copy out of pinned host memory is done

  DeviceBuffer<__nv_bfloat16> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  // The context projection (config.context_width > 0, else empty): fc [hidden, width], its
  // norm [hidden], and the rows of one AppendContext [max_rows, width].
  DeviceBuffer<__nv_bfloat16> context_fc_, context_norm_, context_in_;
  std::vector<Layer> layers_;
  DeviceBuffer<float> inv_freq_;
  DeviceKvPool kv_;
  std::unique_ptr<GemmRunner> gemm_;
  std::unique_ptr<TreeAttention> attention_;

  // Activations for max_rows rows.
  DeviceBuffer<__nv_bfloat16> x_, h_, out_, qkv_, q_, attn_, gate_up_, act_;
  DeviceBuffer<float> logits_;    // [max_rows, max vocab slice] (rows of the rank's slice)
  DeviceBuffer<float> gathered_;  // tp > 1: [tp, max_rows, max vocab slice]
  DeviceBuffer<float> full_;      // tp > 1: [max_rows, vocab]
  DeviceBuffer<float> part_max_, all_max_;    // tp > 1 greedy: [max_rows], [tp, max_rows]
  DeviceBuffer<int32_t> part_idx_, all_idx_;  // the ids of those maxima
  DeviceBuffer<int32_t> rows_meta_;           // [3, max_rows]
  DeviceBuffer<int32_t> commit_meta_;         // CommitPath's meta
  DeviceBuffer<unsigned char> step_in_;       // verify-step inputs (StepLayout)
  DeviceBuffer<int32_t> choice_;              // [step_rows]
  DeviceBuffer<int32_t> step_out_;            // walk outputs
  DeviceBuffer<int32_t> top_tokens_;          // rank 0: [max_rows, kMaxTopKLogProbs] RankTopK
  DeviceBuffer<float> top_logprobs_;          // rank 0: the same shape
  DeviceBuffer<__nv_bfloat16> features_;      // rank 0: [max_rows, feature width] or empty
  std::vector<int> feature_slot_;             // per layer: its block in a features_ row, or -1
  int feature_width_ = 0;                     // layers × hidden

  // CUDA graphs (tp == 1): per attention tile size (64-row tiles first) and bucket of rows
  // (GraphBucketOf in model_shard.cc), the graph of Layers(rows) and the attention grid it was
  // captured with.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int attention_capacity = 0;
  };
  std::vector<Graph> graphs_;
  PinnedBuffer meta_staging_;  // [3, max_rows] int32: rows_meta_'s padded host twin

  // Op timing: events_[i] ends ops_[i] (timing_ on).
  bool timing_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<ShardOp> ops_;
  size_t marks_ = 0;
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_MODEL_SHARD_H_
