#include "common/cuda/cuda_causal_lm.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/choose_token.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/embedding.h"
#include "common/cuda/gemm.h"
#include "common/cuda/kv_commit.h"
#include "common/cuda/kv_write.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/random_fill.h"
#include "common/cuda/rms_norm.h"
#include "common/cuda/silu_mul.h"
#include "common/cuda/tree_attention.h"
#include "common/cuda/tree_walk.h"
#include "common/model/dtype.h"
#include "common/model/forward_batch.h"
#include "common/model/kv_cache.h"
#include "common/tree/token_tree.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

using bf16 = __nv_bfloat16;

// Where the device weights come from: Make(names) returns the named Hugging Face tensors
// concatenated along their first dimension, as bf16 on the device.
using TensorMaker =
    std::function<absl::StatusOr<DeviceBuffer<bf16>>(std::initializer_list<std::string>)>;

// From host fp32 tensors (a loaded checkpoint), rounded to bf16.
TensorMaker FromHost(const ModelConfig& config, const ModelWeights& weights) {
  auto by_name = std::make_shared<absl::flat_hash_map<std::string, const Tensor*>>();
  // ForEachTensor only reads here; it takes a mutable reference for the loader's sake.
  ForEachTensor(config, const_cast<ModelWeights&>(weights), [&](TensorSlot& slot) {
    if (slot.present) (*by_name)[slot.hf_name] = slot.tensor;
  });
  return [by_name](std::initializer_list<std::string> names) -> absl::StatusOr<DeviceBuffer<bf16>> {
    std::vector<uint16_t> host;
    for (const std::string& name : names) {
      const auto it = by_name->find(name);
      if (it == by_name->end()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
      const Tensor& t = *it->second;
      for (int64_t i = 0; i < t.numel(); ++i) host.push_back(FloatToBf16Bits(t.data()[i]));
    }
    ASSIGN_OR_RETURN(DeviceBuffer<bf16> buffer, DeviceBuffer<bf16>::Create(host.size()));
    RETURN_IF_ERROR(buffer.CopyFromHost(
        absl::MakeConstSpan(reinterpret_cast<const bf16*>(host.data()), host.size())));
    return buffer;
  };
}

// Random values made on the device, with the spread of testing::RandomWeights (norms 1 ± 0.2,
// biases std 0.3, embedding and head std 3/sqrt(hidden), projections std 1/sqrt(in)).
TensorMaker Random(const ModelConfig& config, uint64_t seed, cudaStream_t stream) {
  auto shapes = std::make_shared<absl::flat_hash_map<std::string, std::vector<int64_t>>>();
  ModelWeights empty;
  ForEachTensor(config, empty, [&](TensorSlot& slot) {
    if (slot.present) (*shapes)[slot.hf_name] = slot.shape;
  });
  const float hidden = static_cast<float>(config.hidden_size);
  return [shapes, seed, stream,
          hidden](std::initializer_list<std::string> names) -> absl::StatusOr<DeviceBuffer<bf16>> {
    size_t total = 0;
    for (const std::string& name : names) {
      const auto it = shapes->find(name);
      if (it == shapes->end()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
      int64_t n = 1;
      for (int64_t d : it->second) n *= d;
      total += n;
    }
    ASSIGN_OR_RETURN(DeviceBuffer<bf16> buffer, DeviceBuffer<bf16>::Create(total));
    size_t at = 0;
    for (const std::string& name : names) {
      const std::vector<int64_t>& shape = shapes->at(name);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      float center = 0.0f, sigma;
      if (absl::EndsWith(name, "norm.weight")) {
        center = 1.0f;
        sigma = 0.2f;
      } else if (absl::EndsWith(name, ".bias")) {
        sigma = 0.3f;
      } else if (absl::StrContains(name, "embed_tokens") || absl::StrContains(name, "lm_head")) {
        sigma = 3.0f / std::sqrt(hidden);
      } else {
        sigma = 1.0f / std::sqrt(static_cast<float>(shape[1]));
      }
      CUDA_RETURN_IF_ERROR(LaunchFillUniformBf16(buffer.data() + at, n,
                                                 seed ^ std::hash<std::string>{}(name), center,
                                                 std::sqrt(3.0f) * sigma, stream));
      at += n;
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return buffer;
  };
}

struct DeviceLayer {
  DeviceBuffer<bf16> input_norm;  // [hidden]
  DeviceBuffer<bf16> w_qkv;       // [(q + 2 kv heads) * head_dim, hidden]
  DeviceBuffer<bf16> b_qkv;       // [(q + 2 kv heads) * head_dim] or empty
  DeviceBuffer<bf16> q_norm;      // [head_dim] or empty
  DeviceBuffer<bf16> k_norm;      // [head_dim] or empty
  DeviceBuffer<bf16> wo;          // [hidden, q heads * head_dim]
  DeviceBuffer<bf16> post_norm;   // [hidden]
  DeviceBuffer<bf16> w_gate_up;   // [2 * intermediate, hidden]: gate rows, then up rows
  DeviceBuffer<bf16> w_down;      // [hidden, intermediate]
};

// Nodes [begin, end) of batch entry `entry`: one sequence's share of a forward chunk.
struct Piece {
  int entry, begin, end;
};

class CudaCausalLm final : public CausalLm {
 public:
  CudaCausalLm(const ModelConfig& config, const LmOptions& options, const CudaLmOptions& cuda,
               int num_pages)
      : config_(config), options_(options), cuda_(cuda), cache_(num_pages, options.kv_page_size) {}

  ~CudaCausalLm() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (staged_ != nullptr) cudaEventDestroy(staged_);
    if (step_begin_ != nullptr) cudaEventDestroy(step_begin_);
    if (step_end_ != nullptr) cudaEventDestroy(step_end_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
    if (step_staging_ != nullptr) cudaFreeHost(step_staging_);
  }

  absl::Status CreateStream() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  absl::Status Init(const TensorMaker& make);
  cudaStream_t stream() const { return stream_; }
  double last_step_device_ms() const { return last_step_device_ms_; }

  const ModelConfig& config() const override { return config_; }
  int tensor_parallel() const override { return 1; }
  std::string device() const override { return absl::StrCat("cuda:", cuda_.device); }

  SeqId CreateSequence() override { return cache_.CreateSequence(); }
  void FreeSequence(SeqId seq) override { cache_.Free(seq); }
  PagedKvCache& kv_cache() override { return cache_; }

  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) override;
  void Commit(SeqId seq, int committed_len, absl::Span<const int> path) override;
  absl::StatusOr<std::vector<StepResult>> VerifyStep(absl::Span<const SeqTree> batch,
                                                     absl::Span<const StepSpec> specs) override;
  void Truncate(SeqId seq, int len) override { cache_.Truncate(seq, len); }

 private:
  // Validates `batch` and reserves its slots; returns every entry's node depths.
  absl::StatusOr<std::vector<std::vector<int32_t>>> PrepareBatch(absl::Span<const SeqTree> batch);
  // Runs the new nodes of a prepared batch in chunks of at most max_rows rows, entries in
  // `order`; after each chunk's forward (logits in logits_) calls on_chunk(first row, rows).
  absl::Status RunChunks(absl::Span<const SeqTree> batch, absl::Span<const int> order,
                         const std::vector<std::vector<int32_t>>& depths,
                         const std::function<absl::Status(int, int)>& on_chunk);
  absl::Status RunChunk(absl::Span<const SeqTree> batch, absl::Span<const Piece> pieces,
                        const std::vector<std::vector<int32_t>>& depths);
  absl::Status Layers(int rows);

  const ModelConfig config_;
  const LmOptions options_;
  const CudaLmOptions cuda_;
  PagedKvCache cache_;
  cudaStream_t stream_ = nullptr;

  DeviceBuffer<bf16> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<DeviceLayer> layers_;
  DeviceBuffer<float> inv_freq_;
  DeviceKvPool kv_;
  std::unique_ptr<GemmRunner> gemm_;
  std::unique_ptr<TreeAttention> attention_;

  // Activations for max_rows rows.
  DeviceBuffer<bf16> x_, h_, out_, qkv_, q_, attn_, gate_up_, act_;
  DeviceBuffer<float> logits_;
  // Per-chunk row metadata: tokens, positions, slots ([3, max_rows] int32), and for Commit:
  // committed length, path length, path, page table offsets, page table.
  DeviceBuffer<int32_t> rows_meta_, commit_meta_;
  int32_t* staging_ = nullptr;  // pinned host twin of rows_meta_ then commit_meta_
  size_t staging_ints_ = 0;
  cudaEvent_t staged_ = nullptr;  // the last copy out of staging_ is done

  // VerifyStep: per-step inputs (packed per step into step_in_) and outputs.
  static constexpr int kStepRows = 1 << 16;  // rows of one verify step (else the host path)
  static constexpr int kStepSeqs = 1024;     // batch entries of one verify step
  static constexpr int kMaxPath = 1024;      // accepted path entries (kv_commit's limit)
  DeviceBuffer<unsigned char> step_in_;
  unsigned char* step_staging_ = nullptr;  // pinned host twin of step_in_
  size_t step_bytes_ = 0;
  DeviceBuffer<int32_t> choice_;    // [kStepRows] the target's choice per row
  DeviceBuffer<int32_t> step_out_;  // path, path_len, emitted
  std::vector<int32_t> step_out_host_;
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;  // GPU span of the last VerifyStep
  double last_step_device_ms_ = 0;
};

absl::Status CudaCausalLm::Init(const TensorMaker& make) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, d = c.head_dim, hq = c.num_q_heads, hkv = c.num_kv_heads;
  const int f = c.intermediate_size, rows = cuda_.max_rows;

  ASSIGN_OR_RETURN(embed_, make({"model.embed_tokens.weight"}));
  ASSIGN_OR_RETURN(final_norm_, make({"model.norm.weight"}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(lm_head_, make({"lm_head.weight"}));
  }
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    DeviceLayer l;
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

  ASSIGN_OR_RETURN(
      kv_, DeviceKvPool::Create(c.num_layers, cache_.num_pages(), cache_.page_size(), hkv, d));
  ASSIGN_OR_RETURN(gemm_, GemmRunner::Create(kDefaultGemmWorkspaceBytes));

  TreeAttentionOptions attn;
  attn.heads = {hq, hkv, hq / hkv, 0};
  attn.head_dim = d;
  attn.page_size = cache_.page_size();
  attn.pool_pages = cache_.num_pages();
  attn.scale = 1.0f / std::sqrt(static_cast<float>(d));
  attn.limits.max_seqs = rows;
  attn.limits.max_pages = cache_.num_pages();
  // Masks of trees (chains need none) of up to a few thousand nodes.
  attn.limits.max_mask_words = std::max(1 << 16, 2 * rows * ((rows + 63) / 64));
  attn.limits.max_items = rows * hkv + 4096;
  attn.limits.max_partials = 4096;
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
  ASSIGN_OR_RETURN(logits_, DeviceBuffer<float>::Create(r * c.vocab_size));
  ASSIGN_OR_RETURN(rows_meta_, DeviceBuffer<int32_t>::Create(3 * r));
  // Commit: [L, path_len, path (max 1024), page offsets (2), pages].
  ASSIGN_OR_RETURN(commit_meta_, DeviceBuffer<int32_t>::Create(4 + 1024 + cache_.num_pages()));
  staging_ints_ = std::max(rows_meta_.size(), commit_meta_.size());
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging_, staging_ints_ * sizeof(int32_t)));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_begin_));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_end_));

  // Verify-step inputs: row sampling parameters, walk tokens and parents, node offsets,
  // committed lengths, page offsets and page table (each region 16-byte aligned).
  step_bytes_ = sizeof(RowSampling) * kStepRows + 2 * sizeof(int32_t) * kStepRows +
                3 * sizeof(int32_t) * (kStepSeqs + 1) + sizeof(int32_t) * cache_.num_pages() +
                6 * 16;
  ASSIGN_OR_RETURN(step_in_, DeviceBuffer<unsigned char>::Create(step_bytes_));
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&step_staging_, step_bytes_));
  ASSIGN_OR_RETURN(choice_, DeviceBuffer<int32_t>::Create(kStepRows));
  ASSIGN_OR_RETURN(step_out_,
                   DeviceBuffer<int32_t>::Create(size_t{kStepSeqs} * (2 * kMaxPath + 1)));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaCausalLm::Forward(absl::Span<const SeqTree> batch) {
  const size_t vocab = config_.vocab_size;
  std::vector<float> logits;
  ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> depths, PrepareBatch(batch));
  std::vector<int> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  RETURN_IF_ERROR(RunChunks(batch, order, depths, [&](int, int rows) -> absl::Status {
    logits.resize(logits.size() + rows * vocab);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data() + logits.size() - rows * vocab,
                                         logits_.data(), rows * vocab * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // logits_ is reused
    return absl::OkStatus();
  }));
  return logits;
}

// The verify step on the device: the forward, the choice at every row, the walk and the KV
// commit run on the stream; only paths and emitted tokens come back. Tree entries are run
// first (rows [0, T) in that order), so the walk sees them packed; prefill entries follow and
// only the choice at their last row is read back.
absl::StatusOr<std::vector<StepResult>> CudaCausalLm::VerifyStep(absl::Span<const SeqTree> batch,
                                                                 absl::Span<const StepSpec> specs) {
  int64_t total_rows = 0;
  for (const SeqTree& s : batch) total_rows += static_cast<int64_t>(s.tokens.size());
  if (specs.size() != batch.size() || batch.size() > kStepSeqs || total_rows > kStepRows) {
    return CausalLm::VerifyStep(batch, specs);  // checks the specs; the host path
  }
  for (const SeqTree& s : batch) {
    if (s.first_new != 0) return CausalLm::VerifyStep(batch, specs);  // refuses it
  }
  // Nothing below reads a tree before it is validated here (depths of malformed parents
  // would index out of range).
  ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> depths, PrepareBatch(batch));
  int max_depth = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    if (specs[b].prefill) continue;
    for (int32_t d : depths[b]) max_depth = std::max(max_depth, d);
  }
  const int max_path = std::min(kMaxPath, max_depth + 1);
  std::vector<int> order;  // trees first, then prefills
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!specs[b].prefill) order.push_back(static_cast<int>(b));
  }
  const int num_trees = static_cast<int>(order.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    if (specs[b].prefill) order.push_back(static_cast<int>(b));
  }

  // Pack the step's inputs: one copy. Rows follow `order`.
  size_t used = 0;
  auto region = [&](size_t bytes) {
    unsigned char* p = step_staging_ + used;
    used += (bytes + 15) / 16 * 16;
    return p;
  };
  auto* params = reinterpret_cast<RowSampling*>(region(sizeof(RowSampling) * total_rows));
  const size_t params_at = 0;
  const size_t tokens_at = used;
  auto* walk_tokens = reinterpret_cast<int32_t*>(region(sizeof(int32_t) * total_rows));
  const size_t parents_at = used;
  auto* walk_parents = reinterpret_cast<int32_t*>(region(sizeof(int32_t) * total_rows));
  const size_t offsets_at = used;
  auto* node_offsets = reinterpret_cast<int32_t*>(region(sizeof(int32_t) * (num_trees + 1)));
  const size_t committed_at = used;
  auto* committed = reinterpret_cast<int32_t*>(region(sizeof(int32_t) * num_trees));
  const size_t page_offsets_at = used;
  auto* page_offsets = reinterpret_cast<int32_t*>(region(sizeof(int32_t) * (num_trees + 1)));
  const size_t page_table_at = used;
  int64_t num_tree_pages = 0;  // page-table entries the commit will need
  for (int i = 0; i < num_trees; ++i) {
    const SeqTree& t = batch[order[i]];
    num_tree_pages +=
        (t.committed_len + static_cast<int64_t>(t.tokens.size()) + cache_.page_size() - 1) /
        cache_.page_size();
  }
  if (used + sizeof(int32_t) * num_tree_pages > step_bytes_) {
    return CausalLm::VerifyStep(batch, specs);
  }
  int row = 0;
  node_offsets[0] = 0;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const SeqTree& t = batch[order[i]];
    const StepSpec& spec = specs[order[i]];
    const int n = static_cast<int>(t.tokens.size());
    const std::vector<int32_t>& depth = depths[order[i]];
    for (int node = 0; node < n; ++node, ++row) {
      RowSampling& r = params[row];
      r = RowSampling();
      r.temperature = spec.sampling.temperature;
      r.top_p = spec.sampling.top_p;
      r.top_k = spec.sampling.top_k;
      r.seed = spec.sampling.seed;
      r.position = spec.prefill ? t.committed_len + node + 1 : t.committed_len + depth[node] + 1;
      if (i < num_trees) {
        walk_tokens[row] = t.tokens[node];
        walk_parents[row] = t.parents[node];
      }
    }
    if (i < num_trees) {
      node_offsets[i + 1] = row;
      committed[i] = t.committed_len;
    }
  }

  // The forward, then the choice at every row of each chunk.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_begin_, stream_));
  bool uploaded = false;
  RETURN_IF_ERROR(RunChunks(batch, order, depths, [&](int row0, int rows) -> absl::Status {
    if (!uploaded) {
      // Page tables after the forward's reservation (the first chunk reserved everything).
      page_offsets[0] = 0;
      int32_t* table = reinterpret_cast<int32_t*>(step_staging_ + page_table_at);
      int at = 0;
      for (int i = 0; i < num_trees; ++i) {
        const std::vector<int> pages = cache_.Pages(batch[order[i]].seq);
        std::copy(pages.begin(), pages.end(), table + at);
        at += static_cast<int>(pages.size());
        page_offsets[i + 1] = at;
      }
      const size_t bytes = page_table_at + sizeof(int32_t) * at;
      if (bytes > step_bytes_) {
        return absl::ResourceExhaustedError("verify step: page tables exceed the step buffer");
      }
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(step_in_.data(), step_staging_, bytes, cudaMemcpyHostToDevice, stream_));
      uploaded = true;
    }
    CUDA_RETURN_IF_ERROR(
        LaunchChooseToken(logits_.data(), rows, config_.vocab_size,
                          reinterpret_cast<const RowSampling*>(step_in_.data() + params_at) + row0,
                          choice_.data() + row0, stream_));
    return absl::OkStatus();
  }));

  // Walk and commit the trees; read back paths, emitted tokens and every row's choice.
  const unsigned char* in = step_in_.data();
  int32_t* path = step_out_.data();
  int32_t* path_len = path + static_cast<size_t>(num_trees) * max_path;
  int32_t* emitted = path_len + num_trees;
  if (num_trees > 0) {
    CUDA_RETURN_IF_ERROR(LaunchTreeWalk(reinterpret_cast<const int32_t*>(in + offsets_at),
                                        reinterpret_cast<const int32_t*>(in + tokens_at),
                                        reinterpret_cast<const int32_t*>(in + parents_at),
                                        choice_.data(), num_trees, max_path, path, path_len,
                                        emitted, stream_));
    const KvLayerView layer0 = kv_.Layer(0);
    const int64_t stride = config_.num_layers > 1 ? kv_.Layer(1).k - layer0.k : 0;
    DevicePageTables tables{reinterpret_cast<const int32_t*>(in + page_table_at),
                            reinterpret_cast<const int32_t*>(in + page_offsets_at)};
    CUDA_RETURN_IF_ERROR(LaunchKvCommit(layer0, config_.num_layers, stride,
                                        reinterpret_cast<const int32_t*>(in + committed_at), path,
                                        max_path, path_len, num_trees, tables, stream_));
  }
  const size_t out_ints = static_cast<size_t>(num_trees) * (2 * max_path + 1);
  step_out_host_.resize(out_ints + total_rows);
  if (out_ints > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_out_host_.data(), step_out_.data(),
                                         out_ints * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                         stream_));
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_out_host_.data() + out_ints, choice_.data(),
                                       total_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                       stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end_, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  float span_ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&span_ms, step_begin_, step_end_));
  last_step_device_ms_ = span_ms;

  std::vector<StepResult> results(batch.size());
  const int32_t* h_path = step_out_host_.data();
  const int32_t* h_len = h_path + static_cast<size_t>(num_trees) * max_path;
  const int32_t* h_emitted = h_len + num_trees;
  const int32_t* h_choice = step_out_host_.data() + out_ints;
  row = 0;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const SeqTree& t = batch[order[i]];
    const int n = static_cast<int>(t.tokens.size());
    StepResult& r = results[order[i]];
    if (i < num_trees) {
      const int len = h_len[i];
      r.path.assign(h_path + static_cast<size_t>(i) * max_path,
                    h_path + static_cast<size_t>(i) * max_path + len);
      r.emitted.assign(h_emitted + static_cast<size_t>(i) * max_path,
                       h_emitted + static_cast<size_t>(i) * max_path + len);
    } else {
      r.path.resize(n);
      std::iota(r.path.begin(), r.path.end(), 0);
      r.emitted.push_back(h_choice[row + n - 1]);
    }
    row += n;
    cache_.Truncate(t.seq, t.committed_len + static_cast<int>(r.path.size()));
  }
  return results;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> CudaCausalLm::PrepareBatch(
    absl::Span<const SeqTree> batch) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));  // callers may be on any thread
  RETURN_IF_ERROR(ValidateForwardBatch(config_, cache_, batch));
  RETURN_IF_ERROR(ReserveForwardBatch(cache_, batch));
  std::vector<std::vector<int32_t>> depths;
  depths.reserve(batch.size());
  for (const SeqTree& s : batch) depths.push_back(NodeDepths(s.parents));
  return depths;
}

absl::Status CudaCausalLm::RunChunks(absl::Span<const SeqTree> batch, absl::Span<const int> order,
                                     const std::vector<std::vector<int32_t>>& depths,
                                     const std::function<absl::Status(int, int)>& on_chunk) {
  std::vector<Piece> chunk;
  int chunk_rows = 0, row0 = 0;
  auto flush = [&]() -> absl::Status {
    RETURN_IF_ERROR(RunChunk(batch, chunk, depths));
    RETURN_IF_ERROR(on_chunk(row0, chunk_rows));
    row0 += chunk_rows;
    chunk.clear();
    chunk_rows = 0;
    return absl::OkStatus();
  };
  for (const int b : order) {
    const int n = static_cast<int>(batch[b].tokens.size());
    for (int node = batch[b].first_new; node < n;) {
      const int take = std::min(n - node, cuda_.max_rows - chunk_rows);
      chunk.push_back({b, node, node + take});
      node += take;
      chunk_rows += take;
      if (chunk_rows == cuda_.max_rows) RETURN_IF_ERROR(flush());
    }
  }
  if (chunk_rows > 0) RETURN_IF_ERROR(flush());
  return absl::OkStatus();
}

absl::Status CudaCausalLm::RunChunk(absl::Span<const SeqTree> batch, absl::Span<const Piece> pieces,
                                    const std::vector<std::vector<int32_t>>& depths) {
  const int ps = cache_.page_size();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_));  // the last copy out of staging_ is done
  int rows = 0;
  for (const Piece& p : pieces) rows += p.end - p.begin;
  int32_t* const tokens = staging_;
  int32_t* const positions = staging_ + rows;
  int32_t* const slots = staging_ + 2 * rows;
  std::vector<std::vector<int32_t>> pages(pieces.size());
  std::vector<std::vector<uint64_t>> masks(pieces.size());
  std::vector<AttnSeqDesc> descs(pieces.size());
  int row = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const SeqTree& s = batch[p.entry];
    const std::vector<int> seq_pages = cache_.Pages(s.seq);
    pages[i].assign(seq_pages.begin(), seq_pages.end());
    for (int node = p.begin; node < p.end; ++node, ++row) {
      const int slot = s.committed_len + node;
      tokens[row] = s.tokens[node];
      positions[row] = s.committed_len + depths[p.entry][node];
      slots[row] = pages[i][slot / ps] * ps + slot % ps;
    }
    bool chain = true;
    for (int node = 0; node < p.end && chain; ++node) chain = s.parents[node] == node - 1;
    if (!chain) {
      masks[i] = AncestorMask(absl::MakeConstSpan(s.parents).subspan(0, p.end));
    }
    descs[i].pages = pages[i];
    descs[i].prefix_len = s.committed_len;
    descs[i].num_nodes = p.end;
    descs[i].first_query = p.begin;
    descs[i].ancestor_mask = masks[i];
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows_meta_.data(), staging_, 3 * rows * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream_));
  RETURN_IF_ERROR(attention_->Prepare(descs, stream_));
  return Layers(rows);
}

// The forward pass of `rows` rows whose metadata is in rows_meta_ and attention_.
absl::Status CudaCausalLm::Layers(int rows) {
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, d = c.head_dim, hq = c.num_q_heads, hkv = c.num_kv_heads;
  const int f = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  const int32_t* tokens = rows_meta_.data();
  const int32_t* positions = tokens + rows;
  const int32_t* slots = tokens + 2 * rows;
  auto gemm = [&](const bf16* x, const DeviceBuffer<bf16>& w, const DeviceBuffer<bf16>* bias, int n,
                  int k, bf16* y) {
    GemmArgs a;
    a.m = rows;
    a.n = n;
    a.k = k;
    a.x = x;
    a.w = w.data();
    a.bias = bias != nullptr && bias->size() > 0 ? bias->data() : nullptr;
    a.y_bf16 = y;
    return gemm_->Run(a, stream_);
  };

  CUDA_RETURN_IF_ERROR(
      LaunchEmbedding(embed_.data(), 0, c.vocab_size, hidden, tokens, rows, x_.data(), stream_));
  for (int l = 0; l < c.num_layers; ++l) {
    DeviceLayer& w = layers_[l];
    const KvLayerView kv = kv_.Layer(l);
    // x += out (the previous layer's MLP); h = norm(x)
    CUDA_RETURN_IF_ERROR(LaunchRmsNorm(x_.data(), l == 0 ? nullptr : out_.data(),
                                       w.input_norm.data(), rows, hidden, eps, h_.data(), stream_));
    RETURN_IF_ERROR(gemm(h_.data(), w.w_qkv, &w.b_qkv, (hq + 2 * hkv) * d, hidden, qkv_.data()));
    CUDA_RETURN_IF_ERROR(LaunchKvWrite(
        qkv_.data(), rows, hq, hkv, d, positions, slots, inv_freq_.data(),
        c.rope_scaling.attention_factor, w.q_norm.size() > 0 ? w.q_norm.data() : nullptr,
        w.k_norm.size() > 0 ? w.k_norm.data() : nullptr, eps, q_.data(), kv, stream_));
    CUDA_RETURN_IF_ERROR(attention_->Run(kv, q_.data(), attn_.data(), stream_));
    RETURN_IF_ERROR(gemm(attn_.data(), w.wo, nullptr, hidden, hq * d, out_.data()));
    CUDA_RETURN_IF_ERROR(LaunchRmsNorm(x_.data(), out_.data(), w.post_norm.data(), rows, hidden,
                                       eps, h_.data(), stream_));
    RETURN_IF_ERROR(gemm(h_.data(), w.w_gate_up, nullptr, 2 * f, hidden, gate_up_.data()));
    CUDA_RETURN_IF_ERROR(
        LaunchSiluMul(gate_up_.data(), gate_up_.data() + f, 2 * f, rows, f, act_.data(), stream_));
    RETURN_IF_ERROR(gemm(act_.data(), w.w_down, nullptr, hidden, f, out_.data()));
  }
  CUDA_RETURN_IF_ERROR(LaunchRmsNorm(x_.data(), out_.data(), final_norm_.data(), rows, hidden, eps,
                                     h_.data(), stream_));
  GemmArgs head;
  head.m = rows;
  head.n = c.vocab_size;
  head.k = hidden;
  head.x = h_.data();
  head.w = c.tie_word_embeddings ? embed_.data() : lm_head_.data();
  head.y_f32 = logits_.data();
  return gemm_->Run(head, stream_);
}

void CudaCausalLm::Commit(SeqId seq, int committed_len, absl::Span<const int> path) {
  const std::vector<int> pages = CheckCommitPath(cache_, seq, committed_len, path);
  bool moves = false;
  for (size_t j = 1; j < path.size(); ++j) moves = moves || path[j] != static_cast<int>(j);
  if (moves) {
    if (path.size() > 1024) Fatal("CudaCausalLm::Commit: path longer than 1024 nodes");
    const int n = static_cast<int>(path.size());
    const int np = static_cast<int>(pages.size());
    // [L][path_len][path...][page offsets 0, np][pages...]
    if (cudaError_t e = cudaEventSynchronize(staged_); e != cudaSuccess) {
      Fatal(absl::StrCat("CudaCausalLm::Commit: ", cudaGetErrorString(e)));
    }
    int32_t* m = staging_;
    m[0] = committed_len;
    m[1] = n;
    std::copy(path.begin(), path.end(), m + 2);
    m[2 + n] = 0;
    m[3 + n] = np;
    std::copy(pages.begin(), pages.end(), m + 4 + n);
    int32_t* dev = commit_meta_.data();
    cudaError_t e = cudaSetDevice(cuda_.device);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(dev, m, (4 + n + np) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_);
    DevicePageTables tables{dev + 4 + n, dev + 2 + n};
    const KvLayerView layer0 = kv_.Layer(0);
    const int64_t stride = config_.num_layers > 1 ? kv_.Layer(1).k - layer0.k : 0;
    if (e == cudaSuccess) {
      e = LaunchKvCommit(layer0, config_.num_layers, stride, dev, dev + 2, n, dev + 1, 1, tables,
                         stream_);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);  // staging_ is reused
    // The interface has no error path (a CUDA failure here leaves the cache unusable).
    if (e != cudaSuccess) {
      Fatal(
          absl::StrCat("CudaCausalLm::Commit: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
  }
  cache_.Truncate(seq, committed_len + static_cast<int>(path.size()));
}

absl::Status ValidateOptions(const ModelConfig& c, const LmOptions& o, const CudaLmOptions& g) {
  if (o.tensor_parallel != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: tensor_parallel ", o.tensor_parallel, " is not supported yet (1 GPU)"));
  }
  if (o.kv_page_size < 16 || (o.kv_page_size & (o.kv_page_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: kv_page_size ", o.kv_page_size,
                                                   " must be a power of two >= 16"));
  }
  if (g.max_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: max_rows ", g.max_rows, " < 1"));
  }
  if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: head_dim ", c.head_dim, " is not supported (32, 64 or 128)"));
  }
  if (c.num_q_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: ", c.num_q_heads,
                                                   " q heads are not a multiple of ",
                                                   c.num_kv_heads, " kv heads"));
  }
  for (const auto& [name, value] : {std::pair{"hidden_size", c.hidden_size},
                                    std::pair{"intermediate_size", c.intermediate_size}}) {
    if (value % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: ", name, " ", value, " is not a multiple of 8 (16-byte GEMM rows)"));
    }
  }
  if (o.kv_pages == 0 && o.max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: max_batch ", o.max_batch, " < 1"));
  }
  return absl::OkStatus();
}

}  // namespace

double LastVerifyStepDeviceMs(const CausalLm& model) {
  const auto* cuda = dynamic_cast<const CudaCausalLm*>(&model);
  return cuda != nullptr ? cuda->last_step_device_ms() : -1.0;
}

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace {

absl::StatusOr<std::unique_ptr<CausalLm>> Create(
    const ModelConfig& config, const LmOptions& options, const CudaLmOptions& cuda,
    const std::function<TensorMaker(cudaStream_t)>& weights) {
  RETURN_IF_ERROR(ValidateOptions(config, options, cuda));
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (cuda.device < 0 || cuda.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: device ", cuda.device, " not in [0, ", count, ")"));
  }
  const int64_t pages = options.kv_pages > 0
                            ? options.kv_pages
                            : static_cast<int64_t>(options.max_batch) *
                                  ((config.max_position_embeddings + options.kv_page_size - 1) /
                                   options.kv_page_size);
  if (pages > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: ", pages, " KV pages is too many"));
  }
  auto lm = std::make_unique<CudaCausalLm>(config, options, cuda, static_cast<int>(pages));
  RETURN_IF_ERROR(lm->CreateStream());
  RETURN_IF_ERROR(lm->Init(weights(lm->stream())));
  return std::unique_ptr<CausalLm>(std::move(lm));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CausalLm>> CreateCudaCausalLm(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const LmOptions& options,
                                                             const CudaLmOptions& cuda) {
  return Create(config, options, cuda, [&](cudaStream_t) { return FromHost(config, weights); });
}

absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCudaCausalLm(const ModelConfig& config,
                                                                   uint64_t seed,
                                                                   const LmOptions& options,
                                                                   const CudaLmOptions& cuda) {
  return Create(config, options, cuda,
                [&](cudaStream_t stream) { return Random(config, seed, stream); });
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadCudaCausalLm(const std::string& model_dir,
                                                           const LmOptions& options,
                                                           const CudaLmOptions& cuda) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(const ModelWeights weights, LoadModelWeights(model_dir, config));
  return CreateCudaCausalLm(config, weights, options, cuda);
}

}  // namespace treespec::gpu
