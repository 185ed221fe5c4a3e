#include "common/cuda/model_shard.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/embedding.h"
#include "common/cuda/kv_commit.h"
#include "common/cuda/kv_write.h"
#include "common/cuda/rms_norm.h"
#include "common/cuda/silu_mul.h"
#include "common/cuda/top_k_logprobs.h"
#include "common/cuda/tree_walk.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {

using bf16 = __nv_bfloat16;

ModelShard::ModelShard(const ModelConfig& config, const TpPlan& plan, const ShardOptions& options,
                       std::unique_ptr<Communicator> comm, PeerReduceGroup* peer)
    : config_(config),
      plan_(plan),
      rank_(plan.ranks[options.rank]),
      options_(options),
      comm_(std::move(comm)),
      peer_(peer) {}

const char* ShardOpName(ShardOp op) {
  static const char* const kNames[] = {"start",      "embed",  "norm",    "qkv",        "kv_write",
                                       "attention",  "o_proj", "gate_up", "silu_mul",   "down",
                                       "all_reduce", "head",   "choose",  "walk_commit"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(ShardOp::kCount));
  return kNames[static_cast<int>(op)];
}

namespace {

// The rows a graph of `rows` rows is captured for, and its bucket: 1, 2, 4, 8; multiples of 8
// up to 64 rows, so a verify step's 17 rows (16 drafted nodes + the root) run the few-row GEMM's
// 24-row form, which is faster than its 32-row form (measured: docs/experiments/README.md, 'the
// 17-row step'); multiples of 64 up to 512; then eight buckets per doubling. Past a few hundred
// rows a step's GEMMs are compute-bound and a padded row costs what a real one does, so the
// padding is kept under an eighth there: a batch's trees of 480 rows with one 128-token prompt
// beside them run 640 rows, where a power-of-two bucket ran 1,024.
struct GraphBucket {
  int rows, index;
};
GraphBucket GraphBucketOf(int rows) {
  if (rows <= 8) {
    int index = 0;
    while ((1 << index) < rows) ++index;
    return {1 << index, index};  // 1, 2, 4, 8 -> 0..3
  }
  if (rows <= 64) {
    const int eighths = (rows + 7) / 8;  // 2..8
    return {8 * eighths, 2 + eighths};   // 16, 24, ..., 64 -> 4..10
  }
  int index = 10, padded = 64, step = 64;  // 128, 192, ..., 512 -> 11..17; 640, ..., 1024 ...
  while (padded < rows) {
    if (padded >= 8 * step) step *= 2;
    padded += step;
    ++index;
  }
  return {padded, index};
}

}  // namespace

ModelShard::~ModelShard() {
  cudaSetDevice(options_.device);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (staged_ != nullptr) cudaEventDestroy(staged_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (Graph& g : graphs_) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  }
}

absl::Status ModelShard::SetOpTiming(bool on) {
  constexpr size_t kEvents = 4096;  // marks between two TakeOpTimes; later ones are dropped
  RETURN_IF_ERROR(Bind());
  while (on && events_.size() < kEvents) {
    cudaEvent_t e;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    events_.push_back(e);
  }
  ops_.resize(events_.size());
  timing_ = on;
  marks_ = 0;
  return absl::OkStatus();
}

void ModelShard::Mark(ShardOp op) {
  if (!timing_ || marks_ >= events_.size()) return;
  if (cudaEventRecord(events_[marks_], stream_) != cudaSuccess) return;
  ops_[marks_++] = op;
}

absl::StatusOr<std::vector<double>> ModelShard::TakeOpTimes() {
  std::vector<double> ms(static_cast<size_t>(ShardOp::kCount), 0.0);
  RETURN_IF_ERROR(Bind());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (size_t i = 1; i < marks_; ++i) {
    if (ops_[i] == ShardOp::kStart) continue;  // the gap before a timed stretch
    float t = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, events_[i - 1], events_[i]));
    ms[static_cast<size_t>(ops_[i])] += t;
  }
  marks_ = 0;
  return ms;
}

absl::StatusOr<std::unique_ptr<ModelShard>> ModelShard::Create(
    const ModelConfig& config, const TpPlan& plan, const ShardOptions& options,
    const TensorSource& source, std::unique_ptr<Communicator> comm, PeerReduceGroup* peer) {
  if (options.rank < 0 || options.rank >= plan.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard rank ", options.rank, " of ", plan.world_size()));
  }
  std::unique_ptr<ModelShard> shard(new ModelShard(config, plan, options, std::move(comm),
                                                   plan.world_size() > 1 ? peer : nullptr));
  RETURN_IF_ERROR(shard->Init(source));
  return shard;
}

absl::Status ModelShard::Bind() const {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return absl::OkStatus();
}

absl::Status ModelShard::Init(const TensorSource& source) {
  RETURN_IF_ERROR(Bind());
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, d = c.head_dim;
  const int hq = rank_.num_q_heads(), hkv = rank_.num_kv_heads(), f = rank_.mlp_width();
  const int tp = plan_.world_size(), slice = plan_.max_vocab_slice();
  auto make = [&](std::initializer_list<std::string> names) {
    return MakeShard(source, c, rank_, names, stream_);
  };

  ASSIGN_OR_RETURN(embed_, make({"model.embed_tokens.weight"}));
  ASSIGN_OR_RETURN(final_norm_, make({"model.norm.weight"}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(lm_head_, make({"lm_head.weight"}));
  }
  if (c.context_width > 0) {
    ASSIGN_OR_RETURN(context_fc_, make({"fc.weight"}));
    ASSIGN_OR_RETURN(context_norm_, make({"hidden_norm.weight"}));
    ASSIGN_OR_RETURN(context_in_, DeviceBuffer<bf16>::Create(
                                      static_cast<size_t>(options_.max_rows) * c.context_width));
  }
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    ASSIGN_OR_RETURN(l.input_norm, make({p + "input_layernorm.weight"}));
    ASSIGN_OR_RETURN(l.w_qkv, make({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                    p + "self_attn.v_proj.weight"}));
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(l.b_qkv, make({p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias",
                                      p + "self_attn.v_proj.bias"}));
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(l.q_norm, make({p + "self_attn.q_norm.weight"}));
      ASSIGN_OR_RETURN(l.k_norm, make({p + "self_attn.k_norm.weight"}));
    }
    ASSIGN_OR_RETURN(l.wo, make({p + "self_attn.o_proj.weight"}));
    ASSIGN_OR_RETURN(l.post_norm, make({p + "post_attention_layernorm.weight"}));
    ASSIGN_OR_RETURN(l.w_gate_up, make({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}));
    ASSIGN_OR_RETURN(l.w_down, make({p + "mlp.down_proj.weight"}));
    layers_.push_back(std::move(l));
  }
  const std::vector<float> inv_freq = RopeInverseFrequencies(c);
  ASSIGN_OR_RETURN(inv_freq_, DeviceBuffer<float>::Create(inv_freq.size()));
  RETURN_IF_ERROR(inv_freq_.CopyFromHost(inv_freq));

  // One page more than the page table hands out: the scratch page that padded graph rows
  // write their K/V into.
  ASSIGN_OR_RETURN(
      kv_, DeviceKvPool::Create(c.num_layers, options_.num_pages + 1, options_.page_size, hkv, d));
  ASSIGN_OR_RETURN(gemm_, GemmRunner::Create(kDefaultGemmWorkspaceBytes, options_.gemm));

  const int rows = options_.max_rows;
  TreeAttentionOptions attn;
  attn.heads = {hq, hkv, plan_.group_size,
                rank_.q_head_begin - rank_.kv_head_begin * plan_.group_size};
  attn.head_dim = d;
  attn.page_size = options_.page_size;
  attn.pool_pages = options_.num_pages + 1;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(d));
  attn.limits.max_seqs = rows;
  attn.limits.max_pages = options_.num_pages + 1;
  // Masks of trees (chains need none) of up to a few thousand nodes.
  attn.limits.max_mask_words = std::max(1 << 16, 2 * rows * ((rows + 63) / 64));
  attn.limits.max_items = rows * hkv + 4096;
  attn.limits.max_partials = 4096;
  attn.tile_rows = options_.attention_tile_rows;
  attn.dependent_launch = options_.attention_dependent_launch;
  attn.fused_merge_row_splits = options_.attention_fused_merge_row_splits;
  attn.wgmma = options_.attention_wgmma;
  attn.proportional_splits = options_.attention_proportional_splits;
  attn.plan_by_critical_path = options_.attention_plan_by_critical_path;
  ASSIGN_OR_RETURN(attention_, TreeAttention::Create(attn));

  const size_t r = static_cast<size_t>(rows);
  ASSIGN_OR_RETURN(x_, DeviceBuffer<bf16>::Create(r * hidden));
  ASSIGN_OR_RETURN(h_, DeviceBuffer<bf16>::Create(r * hidden));
  ASSIGN_OR_RETURN(out_, DeviceBuffer<bf16>::Create(r * hidden));
  ASSIGN_OR_RETURN(qkv_, DeviceBuffer<bf16>::Create(r * (hq + 2 * hkv) * d));
  ASSIGN_OR_RETURN(q_, DeviceBuffer<bf16>::Create(r * hq * d));
  ASSIGN_OR_RETURN(attn_, DeviceBuffer<bf16>::Create(r * hq * d));
  ASSIGN_OR_RETURN(gate_up_, DeviceBuffer<bf16>::Create(r * 2 * f));
  ASSIGN_OR_RETURN(act_, DeviceBuffer<bf16>::Create(r * f));
  ASSIGN_OR_RETURN(logits_, DeviceBuffer<float>::Create(r * slice));
  if (tp > 1) {
    ASSIGN_OR_RETURN(gathered_, DeviceBuffer<float>::Create(r * slice * tp));
    ASSIGN_OR_RETURN(full_, DeviceBuffer<float>::Create(r * c.vocab_size));
    ASSIGN_OR_RETURN(part_max_, DeviceBuffer<float>::Create(r));
    ASSIGN_OR_RETURN(all_max_, DeviceBuffer<float>::Create(r * tp));
    ASSIGN_OR_RETURN(part_idx_, DeviceBuffer<int32_t>::Create(r));
    ASSIGN_OR_RETURN(all_idx_, DeviceBuffer<int32_t>::Create(r * tp));
  }
  ASSIGN_OR_RETURN(rows_meta_, DeviceBuffer<int32_t>::Create(3 * r));
  RETURN_IF_ERROR(meta_staging_.Allocate(3 * r * sizeof(int32_t)));
  graphs_.resize(2 * (GraphBucketOf(rows).index + 1));  // [attention tile size][row bucket]
  // CommitPath: [committed, path_len, path (max 1024), page offsets (2), pages].
  ASSIGN_OR_RETURN(commit_meta_, DeviceBuffer<int32_t>::Create(4 + 1024 + options_.num_pages));
  ASSIGN_OR_RETURN(step_in_, DeviceBuffer<unsigned char>::Create(options_.step_bytes));
  ASSIGN_OR_RETURN(choice_, DeviceBuffer<int32_t>::Create(options_.step_rows));
  ASSIGN_OR_RETURN(step_out_, DeviceBuffer<int32_t>::Create(options_.step_out_ints));
  if (options_.rank == 0) {  // RankTopK runs on rank 0 only
    ASSIGN_OR_RETURN(top_tokens_, DeviceBuffer<int32_t>::Create(r * kMaxTopKLogProbs));
    ASSIGN_OR_RETURN(top_logprobs_, DeviceBuffer<float>::Create(r * kMaxTopKLogProbs));
  }
  RETURN_IF_ERROR(TuneGemms());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status ModelShard::SetFeatureLayers(const std::vector<int>& layers) {
  for (Graph& g : graphs_) {  // captured without (or with other) copies
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    g = Graph{};
  }
  feature_slot_.clear();
  feature_width_ = 0;
  features_ = DeviceBuffer<bf16>();
  if (layers.empty() || options_.rank != 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(features_, DeviceBuffer<bf16>::Create(static_cast<size_t>(options_.max_rows) *
                                                         layers.size() * config_.hidden_size));
  feature_width_ = static_cast<int>(layers.size()) * config_.hidden_size;
  feature_slot_.assign(config_.num_layers, -1);
  for (size_t i = 0; i < layers.size(); ++i) feature_slot_[layers[i]] = static_cast<int>(i);
  return absl::OkStatus();
}

bool ModelShard::UsesGraphs() const { return options_.cuda_graphs && plan_.world_size() == 1; }

absl::Status ModelShard::TuneGemms() {
  if (!UsesGraphs() || layers_.empty()) return absl::OkStatus();
  for (int rows = 1; rows <= std::min(64, options_.max_rows); ++rows) {
    if (GraphBucketOf(rows).rows != rows || gemm_->FewRows(rows)) continue;
    // Each shape is timed over every layer's weights, as a forward streams them. Contents do
    // not matter: every output is written again before it is read.
    std::array<std::vector<const bf16*>, kLayerGemms> weights;
    for (const Layer& l : layers_) {
      const std::array<GemmArgs, kLayerGemms> g = LayerGemmArgs(l, rows);
      for (int i = 0; i < kLayerGemms; ++i) weights[i].push_back(g[i].w);
    }
    const std::array<GemmArgs, kLayerGemms> first = LayerGemmArgs(layers_[0], rows);
    for (int i = 0; i < kLayerGemms; ++i) {
      if (first[i].n == 0 || first[i].k == 0) continue;
      RETURN_IF_ERROR(gemm_->Tune(first[i], stream_, weights[i]));
    }
    const GemmArgs head = HeadGemmArgs(rows);
    RETURN_IF_ERROR(gemm_->Tune(head, stream_, {&head.w, 1}));
  }
  return absl::OkStatus();
}

std::array<GemmArgs, ModelShard::kLayerGemms> ModelShard::LayerGemmArgs(const Layer& w, int rows) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, d = c.head_dim;
  const int hq = rank_.num_q_heads(), hkv = rank_.num_kv_heads(), f = rank_.mlp_width();
  auto args = [rows](const bf16* x, const DeviceBuffer<bf16>& weight,
                     const DeviceBuffer<bf16>* bias, int n, int k, bf16* y) {
    GemmArgs a;
    a.m = rows;
    a.n = n;
    a.k = k;
    a.x = x;
    a.w = weight.data();
    a.bias = bias != nullptr && bias->size() > 0 ? bias->data() : nullptr;
    a.y_bf16 = y;
    return a;
  };
  std::array<GemmArgs, kLayerGemms> g;
  g[kQkvGemm] = args(h_.data(), w.w_qkv, &w.b_qkv, (hq + 2 * hkv) * d, hidden, qkv_.data());
  g[kOProjGemm] = args(attn_.data(), w.wo, nullptr, hidden, hq * d, out_.data());
  // Where the few-row kernel runs it, SiLU(gate) · up straight from the GEMM's fp32 sums into
  // act_; otherwise gate/up into gate_up_ and a SiLU·mul launch after it.
  const bool fused = gemm_->FewRows(rows);
  g[kGateUpGemm] =
      args(h_.data(), w.w_gate_up, nullptr, 2 * f, hidden, fused ? act_.data() : gate_up_.data());
  if (fused) g[kGateUpGemm].epilogue = GemmEpilogue::kSiluMul;
  g[kDownGemm] = args(act_.data(), w.w_down, nullptr, hidden, f, out_.data());
  return g;
}

GemmArgs ModelShard::HeadGemmArgs(int rows) {
  GemmArgs head;
  head.m = rows;
  head.n = rank_.vocab_size();
  head.k = config_.hidden_size;
  head.x = h_.data();
  head.w = config_.tie_word_embeddings ? embed_.data() : lm_head_.data();
  head.y_f32 = logits_.data();
  return head;
}

absl::Status ModelShard::RunLayerGemm(const GemmArgs& args) {
  if (args.k == 0) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        args.y_bf16, 0, static_cast<size_t>(args.m) * args.n * sizeof(bf16), stream_));
    return absl::OkStatus();
  }
  if (args.n == 0) return absl::OkStatus();
  return gemm_->Run(args, stream_);
}

absl::Status ModelShard::WaitStaged() const {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_));
  return absl::OkStatus();
}

absl::Status ModelShard::AllReduce(bf16* data, size_t count) {
  if (plan_.world_size() == 1) return absl::OkStatus();
  RETURN_IF_ERROR(comm_->AllReduceSum(data, count, CommType::kBFloat16, stream_));
  Mark(ShardOp::kAllReduce);
  return absl::OkStatus();
}

bf16* ModelShard::Partial() {
  return peer_ != nullptr ? peer_->mailbox(options_.rank, peer_epoch_ + 1) : out_.data();
}

absl::Status ModelShard::ReduceNorm(int rows, bool add_residual, const bf16* weight) {
  const int hidden = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  if (peer_ != nullptr) {
    CUDA_RETURN_IF_ERROR(peer_->Launch(options_.rank, ++peer_epoch_, rows, x_.data(), add_residual,
                                       weight, hidden, eps, h_.data(), stream_));
    Mark(ShardOp::kAllReduce);
    return absl::OkStatus();
  }
  // Without a residual the partials are x itself (the embedding writes there).
  bf16* partial = add_residual ? out_.data() : x_.data();
  RETURN_IF_ERROR(AllReduce(partial, static_cast<size_t>(rows) * hidden));
  CUDA_RETURN_IF_ERROR(LaunchRmsNorm(x_.data(), add_residual ? out_.data() : nullptr, weight, rows,
                                     hidden, eps, h_.data(), stream_));
  Mark(ShardOp::kNorm);
  return absl::OkStatus();
}

absl::Status ModelShard::Forward(const int32_t* meta, int rows,
                                 absl::Span<const AttnSeqDesc> descs) {
  if (rows < 1 || rows > options_.max_rows) {
    return absl::InternalError(absl::StrCat("shard forward of ", rows, " rows"));
  }
  const bool graph = UsesGraphs() && !timing_;
  int padded = rows;
  if (graph) padded = std::min(GraphBucketOf(rows).rows, options_.max_rows);
  // Padded rows: token 0 at position 0, K/V into the scratch page's first slot.
  RETURN_IF_ERROR(WaitStaged());  // the last upload has left meta_staging_
  int32_t* m = meta_staging_.ints();
  const int32_t scratch_slot = options_.num_pages * options_.page_size;
  for (int part = 0; part < 3; ++part) {
    std::copy(meta + part * rows, meta + (part + 1) * rows, m + part * padded);
    std::fill(m + part * padded + rows, m + (part + 1) * padded, part == 2 ? scratch_slot : 0);
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows_meta_.data(), m, 3 * padded * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream_));
  RETURN_IF_ERROR(attention_->Prepare(descs, stream_));
  return graph ? LayersGraph(padded) : Layers(rows);
}

absl::Status ModelShard::AppendContext(const int32_t* meta, const uint16_t* rows, int num_rows) {
  const ModelConfig& c = config_;
  if (context_fc_.size() == 0) {
    return absl::FailedPreconditionError("this model has no context projection");
  }
  if (num_rows < 1 || num_rows > options_.max_rows) {
    return absl::InternalError(absl::StrCat("shard context of ", num_rows, " rows"));
  }
  const int hidden = c.hidden_size;
  RETURN_IF_ERROR(WaitStaged());  // the last upload has left meta_staging_
  int32_t* m = meta_staging_.ints();
  std::copy(meta, meta + 3 * num_rows, m);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows_meta_.data(), m, 3 * num_rows * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream_));
  // Pageable memory: the copy has left `rows` when the call returns.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      context_in_.data(), rows, static_cast<size_t>(num_rows) * c.context_width * sizeof(bf16),
      cudaMemcpyHostToDevice, stream_));
  GemmArgs fc;
  fc.m = num_rows;
  fc.n = hidden;
  fc.k = c.context_width;
  fc.x = context_in_.data();
  fc.w = context_fc_.data();
  fc.y_bf16 = x_.data();
  RETURN_IF_ERROR(gemm_->Run(fc, stream_));
  CUDA_RETURN_IF_ERROR(LaunchRmsNorm(x_.data(), nullptr, context_norm_.data(), num_rows, hidden,
                                     c.rms_norm_eps, h_.data(), stream_));
  const int32_t* positions = rows_meta_.data() + num_rows;
  const int32_t* slots = rows_meta_.data() + 2 * num_rows;
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& w = layers_[l];
    RETURN_IF_ERROR(RunLayerGemm(LayerGemmArgs(w, num_rows)[kQkvGemm]));  // qkv = c · Wqkvᵀ
    CUDA_RETURN_IF_ERROR(WriteKv(l, num_rows, positions, slots));
  }
  return absl::OkStatus();
}

absl::Status ModelShard::LayersGraph(int rows) {
  const int bucket = GraphBucketOf(rows).index;
  // The attention kernel is part of the graph and differs per query tile size.
  const bool large_tiles = attention_->plan().tile_rows == kAttnMaxTileRows;
  Graph& g = graphs_[bucket + (large_tiles ? graphs_.size() / 2 : 0)];
  const int items = static_cast<int>(attention_->plan().items.size());
  if (g.exec != nullptr && items <= g.attention_capacity) {
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g.exec, stream_));
    return absl::OkStatus();
  }
  // An eager run first: it builds the GEMM plans the capture needs (tuned at load: TuneGemms).
  RETURN_IF_ERROR(Layers(rows));
  const int capacity = std::max(64, 2 * items);
  attention_->set_grid_capacity(capacity);
  cudaGraph_t captured = nullptr;
  absl::Status status;
  if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    status = absl::InternalError(absl::StrCat("graph capture: ", cudaGetErrorString(e)));
  } else {
    status = Layers(rows);
    const cudaError_t end = cudaStreamEndCapture(stream_, &captured);
    if (status.ok() && end != cudaSuccess) {
      status = absl::InternalError(absl::StrCat("graph capture: ", cudaGetErrorString(end)));
    }
  }
  attention_->set_grid_capacity(0);
  cudaGraphExec_t exec = nullptr;
  if (status.ok()) {
    if (cudaError_t e = cudaGraphInstantiate(&exec, captured, 0); e != cudaSuccess) {
      status = absl::InternalError(absl::StrCat("graph instantiate: ", cudaGetErrorString(e)));
    }
  }
  if (captured != nullptr) cudaGraphDestroy(captured);
  RETURN_IF_ERROR(status);
  if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  g.exec = exec;
  g.attention_capacity = capacity;
  return absl::OkStatus();
}

cudaError_t ModelShard::WriteKv(int l, int rows, const int32_t* positions, const int32_t* slots) {
  const ModelConfig& c = config_;
  const Layer& w = layers_[l];
  return LaunchKvWrite(qkv_.data(), rows, rank_.num_q_heads(), rank_.num_kv_heads(), c.head_dim,
                       positions, slots, inv_freq_.data(), c.rope_scaling.attention_factor,
                       w.q_norm.size() > 0 ? w.q_norm.data() : nullptr,
                       w.k_norm.size() > 0 ? w.k_norm.data() : nullptr, c.rms_norm_eps, q_.data(),
                       kv_.Layer(l), stream_);
}

// The forward pass of `rows` rows whose metadata is in rows_meta_ and attention_.
absl::Status ModelShard::Layers(int rows) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, f = rank_.mlp_width();
  const int32_t* tokens = rows_meta_.data();
  const int32_t* positions = tokens + rows;
  const int32_t* slots = tokens + 2 * rows;

  Mark(ShardOp::kStart);
  // x = embedding (all-reduced over the vocabulary slices); h = the first layer's norm(x).
  CUDA_RETURN_IF_ERROR(LaunchEmbedding(embed_.data(), rank_.vocab_begin, rank_.vocab_size(), hidden,
                                       tokens, rows, peer_ != nullptr ? Partial() : x_.data(),
                                       stream_));
  Mark(ShardOp::kEmbed);
  RETURN_IF_ERROR(ReduceNorm(rows, /*add_residual=*/false, layers_[0].input_norm.data()));
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& w = layers_[l];
    const KvLayerView kv = kv_.Layer(l);
    std::array<GemmArgs, kLayerGemms> g = LayerGemmArgs(w, rows);
    RETURN_IF_ERROR(RunLayerGemm(g[kQkvGemm]));
    Mark(ShardOp::kQkv);
    CUDA_RETURN_IF_ERROR(WriteKv(l, rows, positions, slots));
    Mark(ShardOp::kKvWrite);
    CUDA_RETURN_IF_ERROR(attention_->Run(kv, q_.data(), attn_.data(), stream_));
    Mark(ShardOp::kAttention);
    g[kOProjGemm].y_bf16 = Partial();
    RETURN_IF_ERROR(RunLayerGemm(g[kOProjGemm]));
    Mark(ShardOp::kOProj);
    RETURN_IF_ERROR(ReduceNorm(rows, /*add_residual=*/true, w.post_norm.data()));
    if (f > 0) {
      RETURN_IF_ERROR(RunLayerGemm(g[kGateUpGemm]));
      Mark(ShardOp::kGateUp);
      if (g[kGateUpGemm].epilogue != GemmEpilogue::kSiluMul) {
        CUDA_RETURN_IF_ERROR(LaunchSiluMul(gate_up_.data(), gate_up_.data() + f, 2 * f, rows, f,
                                           act_.data(), stream_));
        Mark(ShardOp::kSiluMul);
      }
    }
    g[kDownGemm].y_bf16 = Partial();
    RETURN_IF_ERROR(RunLayerGemm(g[kDownGemm]));
    Mark(ShardOp::kDown);
    // x += MLP; h = the next layer's input norm (the final norm after the last layer).
    RETURN_IF_ERROR(
        ReduceNorm(rows, /*add_residual=*/true,
                   l + 1 < c.num_layers ? layers_[l + 1].input_norm.data() : final_norm_.data()));
    if (!feature_slot_.empty() && feature_slot_[l] >= 0) {  // the layer's output, a feature
      const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(bf16);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync(features_.data() + static_cast<size_t>(feature_slot_[l]) * hidden,
                            feature_width_ * sizeof(bf16), x_.data(), row_bytes, row_bytes, rows,
                            cudaMemcpyDeviceToDevice, stream_));
    }
  }
  RETURN_IF_ERROR(gemm_->Run(HeadGemmArgs(rows), stream_));
  Mark(ShardOp::kHead);
  return absl::OkStatus();
}

absl::StatusOr<const float*> ModelShard::FullLogits(int rows) {
  const int tp = plan_.world_size();
  if (tp == 1) return logits_.data();
  const size_t slice = plan_.max_vocab_slice();
  RETURN_IF_ERROR(comm_->AllGather(logits_.data(), gathered_.data(), rows * slice,
                                   CommType::kFloat32, stream_));
  const size_t vocab = config_.vocab_size;
  for (int q = 0; q < tp; ++q) {
    const TpRankPlan& p = plan_.ranks[q];
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy2DAsync(full_.data() + p.vocab_begin, vocab * sizeof(float),
                          gathered_.data() + q * rows * slice, p.vocab_size() * sizeof(float),
                          p.vocab_size() * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream_));
  }
  return static_cast<const float*>(full_.data());
}

absl::Status ModelShard::Choose(int row0, int rows, const StepLayout& layout, bool all_greedy) {
  const int tp = plan_.world_size();
  int32_t* choice = choice_.data() + row0;
  if (tp > 1 && all_greedy) {
    CUDA_RETURN_IF_ERROR(LaunchArgmaxPartial(logits_.data(), rows, rank_.vocab_size(),
                                             rank_.vocab_begin, part_max_.data(), part_idx_.data(),
                                             stream_));
    RETURN_IF_ERROR(
        comm_->AllGather(part_max_.data(), all_max_.data(), rows, CommType::kFloat32, stream_));
    RETURN_IF_ERROR(
        comm_->AllGather(part_idx_.data(), all_idx_.data(), rows, CommType::kInt32, stream_));
    CUDA_RETURN_IF_ERROR(
        LaunchArgmaxCombine(all_max_.data(), all_idx_.data(), tp, rows, choice, stream_));
    Mark(ShardOp::kChoose);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const float* logits, FullLogits(rows));
  const auto* params = reinterpret_cast<const RowSampling*>(step_in_.data() + layout.params);
  CUDA_RETURN_IF_ERROR(
      LaunchChooseToken(logits, rows, config_.vocab_size, params + row0, choice, stream_));
  Mark(ShardOp::kChoose);
  return absl::OkStatus();
}

absl::Status ModelShard::RankTopK(const float* logits, int first, int rows, int k, int slot) {
  if (top_tokens_.data() == nullptr || k < 1 || k > kMaxTopKLogProbs || first < 0 || slot < 0 ||
      static_cast<size_t>(slot + rows) * k > top_tokens_.size()) {
    return absl::InternalError(absl::StrCat("RankTopK: rows [", first, ", +", rows, ") into slot ",
                                            slot, " with k ", k, " on rank ", options_.rank));
  }
  const size_t at = static_cast<size_t>(slot) * k;
  CUDA_RETURN_IF_ERROR(LaunchTopKLogProbs(logits + static_cast<size_t>(first) * config_.vocab_size,
                                          rows, config_.vocab_size, k, top_tokens_.data() + at,
                                          top_logprobs_.data() + at, stream_));
  return absl::OkStatus();
}

absl::Status ModelShard::UploadStep(const void* host, size_t bytes) {
  if (bytes > step_in_.size()) {
    return absl::InternalError(absl::StrCat("step inputs of ", bytes, " bytes"));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(step_in_.data(), host, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream_));
  return absl::OkStatus();
}

absl::Status ModelShard::WalkAndCommit(const StepLayout& layout, int num_trees, int max_path) {
  if (num_trees == 0) return absl::OkStatus();
  const unsigned char* in = step_in_.data();
  auto ints = [&](size_t at) { return reinterpret_cast<const int32_t*>(in + at); };
  int32_t* path = step_out_.data();
  int32_t* path_len = path + static_cast<size_t>(num_trees) * max_path;
  int32_t* emitted = path_len + num_trees;
  CUDA_RETURN_IF_ERROR(LaunchTreeWalk(ints(layout.node_offsets), ints(layout.tokens),
                                      ints(layout.parents), choice_.data(), num_trees, max_path,
                                      path, path_len, emitted, stream_));
  const KvLayerView layer0 = kv_.Layer(0);
  const int64_t stride = config_.num_layers > 1 ? kv_.Layer(1).k - layer0.k : 0;
  DevicePageTables tables{ints(layout.page_table), ints(layout.page_offsets)};
  CUDA_RETURN_IF_ERROR(LaunchKvCommit(layer0, config_.num_layers, stride, ints(layout.committed),
                                      path, max_path, path_len, num_trees, tables, stream_));
  Mark(ShardOp::kWalkCommit);
  return absl::OkStatus();
}

absl::Status ModelShard::CommitPath(const int32_t* meta, int n, int np) {
  int32_t* dev = commit_meta_.data();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev, meta, (4 + n + np) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream_));
  DevicePageTables tables{dev + 4 + n, dev + 2 + n};
  const KvLayerView layer0 = kv_.Layer(0);
  const int64_t stride = config_.num_layers > 1 ? kv_.Layer(1).k - layer0.k : 0;
  CUDA_RETURN_IF_ERROR(LaunchKvCommit(layer0, config_.num_layers, stride, dev, dev + 2, n, dev + 1,
                                      1, tables, stream_));
  return absl::OkStatus();
}

}  // namespace treespec::gpu
