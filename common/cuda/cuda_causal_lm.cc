#include "common/cuda/cuda_causal_lm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda/choose_token.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/model_shard.h"
#include "common/cuda/nccl_communicator.h"
#include "common/cuda/peer_all_reduce.h"
#include "common/cuda/pinned_buffer.h"
#include "common/cuda/top_k_logprobs.h"
#include "common/cuda/weight_source.h"
#include "common/model/forward_batch.h"
#include "common/model/kv_cache.h"
#include "common/model/tp_plan.h"
#include "common/tree/token_tree.h"
#include "common/util/log.h"
#include "common/util/rank_threads.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

// Nodes [begin, end) of batch entry `entry`: one sequence's share of a forward chunk.
struct Piece {
  int entry, begin, end;
};

class CudaCausalLm final : public CausalLm {
 public:
  CudaCausalLm(const ModelConfig& config, const LmOptions& options, std::vector<int> devices,
               int num_pages)
      : config_(config), devices_(std::move(devices)), cache_(num_pages, options.kv_page_size) {}

  ~CudaCausalLm() override {
    if (step_begin_ != nullptr) cudaEventDestroy(step_begin_);
    if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  }

  absl::Status Init(const CudaLmOptions& cuda,
                    const std::function<TensorSource(cudaStream_t)>& source);
  double last_step_device_ms() const { return last_step_device_ms_; }
  ModelShard& shard(int rank) { return *shards_[rank]; }
  const ModelShard& shard(int rank) const { return *shards_[rank]; }

  const ModelConfig& config() const override { return config_; }
  int tensor_parallel() const override { return static_cast<int>(shards_.size()); }
  std::string device() const override {
    return absl::StrCat("cuda:", absl::StrJoin(devices_, ","));
  }

  SeqId CreateSequence() override { return cache_.CreateSequence(); }
  void FreeSequence(SeqId seq) override { cache_.Free(seq); }
  PagedKvCache& kv_cache() override { return cache_; }

  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) override {
    return ForwardCapturing(batch, nullptr);
  }
  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ForwardTopK(
      absl::Span<const SeqTree> batch, int k, TopKRows rows) override;
  void Commit(SeqId seq, int committed_len, absl::Span<const int> path) override;
  absl::StatusOr<std::vector<StepResult>> VerifyStep(absl::Span<const SeqTree> batch,
                                                     absl::Span<const StepSpec> specs) override;
  void Truncate(SeqId seq, int len) override { cache_.Truncate(seq, len); }
  absl::Status SetFeatureLayers(std::vector<int> layers) override;
  absl::Status AppendContext(absl::Span<const ContextRows> batch) override;

 protected:
  absl::StatusOr<std::vector<float>> ForwardCapturing(absl::Span<const SeqTree> batch,
                                                      std::vector<uint16_t>* features) override;

 private:
  // Rank 0, after a chunk's forward: its `rows` feature rows, copied (on the stream, not yet
  // waited for) to rows [row0, row0 + rows) of feature_staging_, which grows to hold `total`.
  absl::Status StageFeatures(ModelShard& shard, int64_t row0, int rows, int64_t total);
  // Runs fn(shard) for every rank on its thread with its device current; the first error.
  absl::Status OnRanks(const std::function<absl::Status(ModelShard&)>& fn);
  // Validates `batch` and reserves its slots; returns every entry's node depths.
  absl::StatusOr<std::vector<std::vector<int32_t>>> PrepareBatch(absl::Span<const SeqTree> batch);
  // Runs the new nodes of a prepared batch in chunks of at most max_rows rows, entries in
  // `order`; after each chunk's forward calls on_chunk(shard, first row, rows) on every rank.
  absl::Status RunChunks(absl::Span<const SeqTree> batch, absl::Span<const int> order,
                         const std::vector<std::vector<int32_t>>& depths,
                         const std::function<absl::Status(ModelShard&, int, int)>& on_chunk);
  absl::Status RunChunk(absl::Span<const SeqTree> batch, absl::Span<const Piece> pieces,
                        const std::vector<std::vector<int32_t>>& depths,
                        const std::function<absl::Status(ModelShard&)>& after);
  // Returns when no shard still reads staging_ or step_staging_.
  absl::Status WaitStaged();
  // The verify step's device inputs (StepLayout), packed into step_staging_ for rows in `order`
  // (the first num_trees entries are trees); `bytes` of it are used, `argmax_only` marks the
  // rows whose choice needs no full logits: greedy rows, and a prefill's rows before its last
  // (their choice is never read), so that under tp > 1 a chunk of such rows exchanges only
  // (max, id) per rank instead of all-gathering its logits (2048 rows × a 128k vocabulary
  // would be 1 GB).
  struct PackedStep {
    StepLayout layout;
    size_t bytes = 0;
    std::vector<char> argmax_only;
  };
  PackedStep PackStep(absl::Span<const SeqTree> batch, absl::Span<const StepSpec> specs,
                      absl::Span<const int> order, int num_trees,
                      const std::vector<std::vector<int32_t>>& depths, int64_t total_rows,
                      int64_t step_pages);

  // VerifyStep: rows of one step (else the host path), batch entries, accepted path entries
  // (kv_commit's limit).
  static constexpr int kStepRows = 1 << 16;
  static constexpr int kStepSeqs = 1024;
  static constexpr int kMaxPath = 1024;

  const ModelConfig config_;
  const std::vector<int> devices_;  // [tp] CUDA ordinal of each rank
  int max_rows_ = 0;
  PagedKvCache cache_;                     // the page table, shared by every rank's KV pool
  std::unique_ptr<PeerReduceGroup> peer_;  // tp > 1 with peer access (outlives the shards)
  std::vector<std::unique_ptr<ModelShard>> shards_;
  std::unique_ptr<RankThreads> threads_;

  std::vector<int32_t> chunk_meta_;        // a chunk's tokens, positions, slots (shards copy them)
  std::vector<uint16_t> context_staging_;  // an AppendContext's rows, gathered
  PinnedBuffer staging_;                   // Commit's meta
  PinnedBuffer step_staging_;              // the verify step's inputs (StepLayout)
  std::vector<int32_t> step_out_host_;
  PinnedBuffer feature_staging_;  // a step's feature rows, bf16 (grows, never shrinks)
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;  // rank 0's span of the last step
  double last_step_device_ms_ = 0;
};

absl::Status CudaCausalLm::Init(const CudaLmOptions& cuda,
                                const std::function<TensorSource(cudaStream_t)>& source) {
  const ModelConfig& config = config_;
  max_rows_ = cuda.max_rows;
  const int tp = static_cast<int>(devices_.size());
  ASSIGN_OR_RETURN(const TpPlan plan, MakeTpPlan(config, tp));
  std::vector<std::unique_ptr<Communicator>> comms(tp);
  if (tp > 1) {
    ASSIGN_OR_RETURN(comms, CreateNcclCommunicators(devices_));
    if (cuda.peer_all_reduce) {
      ASSIGN_OR_RETURN(peer_, PeerReduceGroup::Create(
                                  devices_, static_cast<size_t>(max_rows_) * config.hidden_size));
    }
  }
  ShardOptions o;
  o.num_pages = cache_.num_pages();
  o.page_size = cache_.page_size();
  o.max_rows = max_rows_;
  o.step_rows = kStepRows;
  o.step_bytes = sizeof(RowSampling) * kStepRows + 2 * sizeof(int32_t) * kStepRows +
                 3 * sizeof(int32_t) * (kStepSeqs + 1) + sizeof(int32_t) * cache_.num_pages() +
                 8 * 16;
  o.step_out_ints = size_t{kStepSeqs} * (2 * kMaxPath + 1);
  o.cuda_graphs = cuda.cuda_graphs;
  o.gemm = cuda.gemm;
  o.attention_tile_rows = cuda.attention_tile_rows;
  o.attention_dependent_launch = cuda.attention_dependent_launch;
  o.attention_fused_merge_row_splits = cuda.attention_fused_merge_row_splits;
  o.attention_wgmma = cuda.attention_wgmma;
  o.attention_proportional_splits = cuda.attention_proportional_splits;
  o.attention_plan_by_critical_path = cuda.attention_plan_by_critical_path;
  for (int r = 0; r < tp; ++r) {
    o.device = devices_[r];
    o.rank = r;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
    cudaStream_t stream = nullptr;  // for the weight source's device-side work
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    absl::StatusOr<std::unique_ptr<ModelShard>> shard =
        ModelShard::Create(config, plan, o, source(stream), std::move(comms[r]), peer_.get());
    cudaStreamDestroy(stream);
    if (!shard.ok()) return shard.status();
    shards_.push_back(std::move(*shard));
  }
  threads_ = std::make_unique<RankThreads>(tp);
  RETURN_IF_ERROR(staging_.Allocate(sizeof(int32_t) * (4 + kMaxPath + cache_.num_pages())));
  RETURN_IF_ERROR(step_staging_.Allocate(o.step_bytes));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[0]));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_begin_));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_end_));
  return absl::OkStatus();
}

absl::Status CudaCausalLm::OnRanks(const std::function<absl::Status(ModelShard&)>& fn) {
  std::vector<absl::Status> status(shards_.size());
  threads_->Run([&](int r) {
    status[r] = shards_[r]->Bind();
    if (status[r].ok()) status[r] = fn(*shards_[r]);
  });
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status CudaCausalLm::WaitStaged() {
  for (const auto& shard : shards_) RETURN_IF_ERROR(shard->WaitStaged());
  return absl::OkStatus();
}

absl::Status CudaCausalLm::SetFeatureLayers(std::vector<int> layers) {
  RETURN_IF_ERROR(CausalLm::SetFeatureLayers(std::move(layers)));
  absl::Status status =
      OnRanks([&](ModelShard& shard) { return shard.SetFeatureLayers(feature_layers()); });
  if (!status.ok()) {  // none rather than some ranks' half
    CausalLm::SetFeatureLayers({}).IgnoreError();
    OnRanks([](ModelShard& shard) { return shard.SetFeatureLayers({}); }).IgnoreError();
  }
  return status;
}

absl::Status CudaCausalLm::AppendContext(absl::Span<const ContextRows> batch) {
  RETURN_IF_ERROR(ReserveContextRows(config_, cache_, batch));
  const int ps = cache_.page_size(), width = config_.context_width;
  // Every entry's rows in order, in one host buffer with each row's position and slot; then
  // max_rows_ at a time: [unused tokens, positions, slots] and the chunk's rows.
  std::vector<int32_t> positions, slots;
  context_staging_.clear();
  for (const ContextRows& e : batch) {
    const std::vector<int> pages = cache_.Pages(e.seq);
    for (int i = 0; i < e.rows->rows; ++i) {
      const int slot = e.committed_len + i;
      positions.push_back(slot);
      slots.push_back(pages[slot / ps] * ps + slot % ps);
    }
    context_staging_.insert(context_staging_.end(), e.rows->bf16.begin(), e.rows->bf16.end());
  }
  const int total = static_cast<int>(positions.size());
  for (int row0 = 0; row0 < total; row0 += max_rows_) {
    const int n = std::min(max_rows_, total - row0);
    chunk_meta_.assign(3 * static_cast<size_t>(n), 0);
    std::copy_n(positions.begin() + row0, n, chunk_meta_.begin() + n);
    std::copy_n(slots.begin() + row0, n, chunk_meta_.begin() + 2 * n);
    const uint16_t* chunk = context_staging_.data() + static_cast<size_t>(row0) * width;
    RETURN_IF_ERROR(OnRanks(
        [&](ModelShard& shard) { return shard.AppendContext(chunk_meta_.data(), chunk, n); }));
  }
  return absl::OkStatus();
}

absl::Status CudaCausalLm::StageFeatures(ModelShard& shard, int64_t row0, int rows, int64_t total) {
  const size_t row_bytes = feature_layers().size() * config_.hidden_size * sizeof(uint16_t);
  if (feature_staging_.bytes() < total * row_bytes) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(shard.stream()));  // earlier chunks' copies
    RETURN_IF_ERROR(feature_staging_.Reserve(total * row_bytes));
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(feature_staging_.data() + row0 * row_bytes, shard.features(),
                                       rows * row_bytes, cudaMemcpyDeviceToHost, shard.stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaCausalLm::ForwardCapturing(absl::Span<const SeqTree> batch,
                                                                  std::vector<uint16_t>* features) {
  const size_t vocab = config_.vocab_size;
  std::vector<float> logits;
  ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> depths, PrepareBatch(batch));
  std::vector<int> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  int64_t total_rows = 0;
  for (const SeqTree& s : batch) total_rows += static_cast<int64_t>(s.tokens.size()) - s.first_new;
  RETURN_IF_ERROR(
      RunChunks(batch, order, depths, [&](ModelShard& shard, int row0, int rows) -> absl::Status {
        ASSIGN_OR_RETURN(const float* full, shard.FullLogits(rows));
        if (&shard != shards_[0].get()) return absl::OkStatus();
        logits.resize(logits.size() + rows * vocab);
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data() + logits.size() - rows * vocab, full,
                                             rows * vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                             shard.stream()));
        if (features != nullptr) RETURN_IF_ERROR(StageFeatures(shard, row0, rows, total_rows));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(shard.stream()));  // the logits are reused
        return absl::OkStatus();
      }));
  if (features != nullptr) {
    const uint16_t* staged = reinterpret_cast<const uint16_t*>(feature_staging_.data());
    features->assign(staged, staged + total_rows * feature_layers().size() * config_.hidden_size);
  }
  return logits;
}

// The drafter's forward: the chosen rows are ranked on rank 0's GPU (after the all-gather of the
// logits under tp > 1) and only k (token, log-prob) pairs per row are copied back.
absl::StatusOr<std::vector<std::vector<TokenLogProb>>> CudaCausalLm::ForwardTopK(
    absl::Span<const SeqTree> batch, int k, TopKRows rows) {
  const int vocab = config_.vocab_size;
  if (k >= 1) k = std::min(k, vocab);
  if (k < 1 || k > kMaxTopKLogProbs || vocab > kMaxChooseVocab) {
    return CausalLm::ForwardTopK(batch, k, rows);  // the error, or the host path
  }
  ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> depths, PrepareBatch(batch));
  std::vector<char> wanted;  // [new rows in batch order]
  for (const SeqTree& s : batch) {
    const int n = static_cast<int>(s.tokens.size()) - s.first_new;
    for (int r = 0; r < n; ++r) wanted.push_back(rows == TopKRows::kAllNew || r + 1 == n);
  }
  std::vector<int> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<TokenLogProb>> out;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  RETURN_IF_ERROR(RunChunks(
      batch, order, depths, [&](ModelShard& shard, int row0, int chunk_rows) -> absl::Status {
        ASSIGN_OR_RETURN(const float* full, shard.FullLogits(chunk_rows));
        if (&shard != shards_[0].get()) return absl::OkStatus();
        int slots = 0;  // runs of wanted rows, each ranked by one launch
        for (int r = 0; r < chunk_rows;) {
          if (!wanted[row0 + r]) {
            ++r;
            continue;
          }
          int end = r;
          while (end < chunk_rows && wanted[row0 + end]) ++end;
          RETURN_IF_ERROR(shard.RankTopK(full, r, end - r, k, slots));
          slots += end - r;
          r = end;
        }
        if (slots == 0) return absl::OkStatus();
        const size_t n = static_cast<size_t>(slots) * k;
        tokens.resize(n);
        logprobs.resize(n);
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens.data(), shard.top_tokens(), n * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, shard.stream()));
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logprobs.data(), shard.top_logprobs(),
                                             n * sizeof(float), cudaMemcpyDeviceToHost,
                                             shard.stream()));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(shard.stream()));  // the buffers are reused
        for (int j = 0; j < slots; ++j) {
          std::vector<TokenLogProb>& ranked = out.emplace_back();
          // Non-finite log-probs rank last: the list ends at the first one.
          for (int i = 0; i < k && std::isfinite(logprobs[static_cast<size_t>(j) * k + i]); ++i) {
            ranked.push_back(
                {tokens[static_cast<size_t>(j) * k + i], logprobs[static_cast<size_t>(j) * k + i]});
          }
        }
        return absl::OkStatus();
      }));
  return out;
}

// The verify step on the devices: the forward, the choice at every row, the walk and the KV
// commit run on the streams; only paths and emitted tokens come back (from rank 0; every rank
// computes the same choices and commits its own heads). Tree entries are run first (rows
// [0, T) in that order), so the walk sees them packed; prefill entries follow and only the
// choice at their last row is read back.
absl::StatusOr<std::vector<StepResult>> CudaCausalLm::VerifyStep(absl::Span<const SeqTree> batch,
                                                                 absl::Span<const StepSpec> specs) {
  int64_t total_rows = 0;
  for (const SeqTree& s : batch) total_rows += static_cast<int64_t>(s.tokens.size());
  if (specs.size() != batch.size() || batch.size() > kStepSeqs || total_rows > kStepRows) {
    return CausalLm::VerifyStep(batch, specs);  // checks the specs; the host path
  }
  RETURN_IF_ERROR(CheckFeatureCapture(specs));
  const bool capture =
      std::any_of(specs.begin(), specs.end(), [](const StepSpec& s) { return s.capture_features; });
  for (const SeqTree& s : batch) {
    if (s.first_new != 0) return CausalLm::VerifyStep(batch, specs);  // refuses it
  }
  int64_t step_pages = 0;  // page-table entries the commit will need, at most
  for (const SeqTree& s : batch) {
    step_pages +=
        (s.committed_len + static_cast<int64_t>(s.tokens.size()) + cache_.page_size() - 1) /
        cache_.page_size();
  }
  if (step_pages > cache_.num_pages()) return CausalLm::VerifyStep(batch, specs);
  // Nothing below reads a tree before it is validated here (depths of malformed parents
  // would index out of range). This also reserves every slot the step writes.
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

  // Pack the step's inputs: one copy per rank. Rows follow `order`.
  RETURN_IF_ERROR(WaitStaged());  // no rank still reads step_staging_
  const PackedStep packed =
      PackStep(batch, specs, order, num_trees, depths, total_rows, step_pages);
  const StepLayout& layout = packed.layout;
  const std::vector<char>& argmax_only = packed.argmax_only;
  unsigned char* const host = step_staging_.data();
  const size_t step_bytes = packed.bytes;

  // The step's inputs, the forward, then the choice at every row of each chunk.
  RETURN_IF_ERROR(OnRanks([&](ModelShard& shard) -> absl::Status {
    if (&shard == shards_[0].get()) {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(step_begin_, shard.stream()));
    }
    return shard.UploadStep(host, step_bytes);
  }));
  RETURN_IF_ERROR(
      RunChunks(batch, order, depths, [&](ModelShard& shard, int row0, int rows) -> absl::Status {
        const bool all_greedy =
            std::all_of(argmax_only.begin() + row0, argmax_only.begin() + row0 + rows,
                        [](char g) { return g != 0; });
        if (capture && &shard == shards_[0].get()) {
          RETURN_IF_ERROR(StageFeatures(shard, row0, rows, total_rows));
        }
        return shard.Choose(row0, rows, layout, all_greedy);
      }));

  // Walk and commit the trees on every rank; rank 0 reads back paths, emitted tokens and every
  // row's choice.
  const size_t out_ints = static_cast<size_t>(num_trees) * (2 * max_path + 1);
  step_out_host_.resize(out_ints + total_rows);
  RETURN_IF_ERROR(OnRanks([&](ModelShard& shard) -> absl::Status {
    RETURN_IF_ERROR(shard.WalkAndCommit(layout, num_trees, max_path));
    if (&shard != shards_[0].get()) return absl::OkStatus();
    cudaStream_t stream = shard.stream();
    if (out_ints > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_out_host_.data(), shard.step_out(),
                                           out_ints * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                           stream));
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_out_host_.data() + out_ints, shard.choice(),
                                         total_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                         stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end_, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    float span_ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&span_ms, step_begin_, step_end_));
    last_step_device_ms_ = span_ms;
    return absl::OkStatus();
  }));

  std::vector<StepResult> results(batch.size());
  const int32_t* h_path = step_out_host_.data();
  const int32_t* h_len = h_path + static_cast<size_t>(num_trees) * max_path;
  const int32_t* h_emitted = h_len + num_trees;
  const int32_t* h_choice = step_out_host_.data() + out_ints;
  int row = 0;
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
    if (specs[order[i]].capture_features) {
      r.features =
          SelectRows(reinterpret_cast<const uint16_t*>(feature_staging_.data()),
                     static_cast<int>(feature_layers().size()) * config_.hidden_size, row, r.path);
    }
    row += n;
    cache_.Truncate(t.seq, t.committed_len + static_cast<int>(r.path.size()));
  }
  return results;
}

CudaCausalLm::PackedStep CudaCausalLm::PackStep(absl::Span<const SeqTree> batch,
                                                absl::Span<const StepSpec> specs,
                                                absl::Span<const int> order, int num_trees,
                                                const std::vector<std::vector<int32_t>>& depths,
                                                int64_t total_rows, int64_t step_pages) {
  PackedStep packed;
  size_t used = 0;
  auto region = [&](size_t bytes) {
    const size_t at = used;
    used += (bytes + 15) / 16 * 16;
    return at;
  };
  StepLayout& layout = packed.layout;
  layout.params = region(sizeof(RowSampling) * total_rows);
  layout.tokens = region(sizeof(int32_t) * total_rows);
  layout.parents = region(sizeof(int32_t) * total_rows);
  layout.node_offsets = region(sizeof(int32_t) * (num_trees + 1));
  layout.committed = region(sizeof(int32_t) * num_trees);
  layout.page_offsets = region(sizeof(int32_t) * (num_trees + 1));
  layout.page_table = region(sizeof(int32_t) * step_pages);
  unsigned char* const host = step_staging_.data();
  auto* params = reinterpret_cast<RowSampling*>(host + layout.params);
  auto* walk_tokens = reinterpret_cast<int32_t*>(host + layout.tokens);
  auto* walk_parents = reinterpret_cast<int32_t*>(host + layout.parents);
  auto* node_offsets = reinterpret_cast<int32_t*>(host + layout.node_offsets);
  auto* committed = reinterpret_cast<int32_t*>(host + layout.committed);
  auto* page_offsets = reinterpret_cast<int32_t*>(host + layout.page_offsets);
  auto* page_table = reinterpret_cast<int32_t*>(host + layout.page_table);
  packed.argmax_only.resize(total_rows);
  int row = 0;
  node_offsets[0] = 0;
  page_offsets[0] = 0;
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
      packed.argmax_only[row] = !(r.temperature > 0.0f) || (spec.prefill && node + 1 < n);
      if (i < num_trees) {
        walk_tokens[row] = t.tokens[node];
        walk_parents[row] = t.parents[node];
      }
    }
    if (i < num_trees) {
      node_offsets[i + 1] = row;
      committed[i] = t.committed_len;
      const std::vector<int> pages = cache_.Pages(t.seq);
      std::copy(pages.begin(), pages.end(), page_table + page_offsets[i]);
      page_offsets[i + 1] = page_offsets[i] + static_cast<int>(pages.size());
    }
  }
  packed.bytes = layout.page_table + sizeof(int32_t) * page_offsets[num_trees];
  return packed;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> CudaCausalLm::PrepareBatch(
    absl::Span<const SeqTree> batch) {
  RETURN_IF_ERROR(ValidateForwardBatch(config_, cache_, batch));
  for (size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].bidirectional && static_cast<int>(batch[b].tokens.size()) > max_rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", b, ": a bidirectional tree of ", batch[b].tokens.size(),
                       " nodes does not fit one chunk of ", max_rows_, " rows (max_rows)"));
    }
  }
  RETURN_IF_ERROR(ReserveForwardBatch(cache_, batch));
  std::vector<std::vector<int32_t>> depths;
  depths.reserve(batch.size());
  for (const SeqTree& s : batch) depths.push_back(NodeDepths(s.parents));
  return depths;
}

absl::Status CudaCausalLm::RunChunks(
    absl::Span<const SeqTree> batch, absl::Span<const int> order,
    const std::vector<std::vector<int32_t>>& depths,
    const std::function<absl::Status(ModelShard&, int, int)>& on_chunk) {
  std::vector<Piece> chunk;
  int chunk_rows = 0, row0 = 0;
  auto flush = [&]() -> absl::Status {
    RETURN_IF_ERROR(RunChunk(batch, chunk, depths,
                             [&](ModelShard& shard) { return on_chunk(shard, row0, chunk_rows); }));
    row0 += chunk_rows;
    chunk.clear();
    chunk_rows = 0;
    return absl::OkStatus();
  };
  for (const int b : order) {
    const int n = static_cast<int>(batch[b].tokens.size());
    // A bidirectional tree's nodes all see each other: one chunk holds it whole.
    if (batch[b].bidirectional && chunk_rows + n > max_rows_) RETURN_IF_ERROR(flush());
    for (int node = batch[b].first_new; node < n;) {
      const int take = std::min(n - node, max_rows_ - chunk_rows);
      chunk.push_back({b, node, node + take});
      node += take;
      chunk_rows += take;
      if (chunk_rows == max_rows_) RETURN_IF_ERROR(flush());
    }
  }
  if (chunk_rows > 0) RETURN_IF_ERROR(flush());
  return absl::OkStatus();
}

absl::Status CudaCausalLm::RunChunk(absl::Span<const SeqTree> batch, absl::Span<const Piece> pieces,
                                    const std::vector<std::vector<int32_t>>& depths,
                                    const std::function<absl::Status(ModelShard&)>& after) {
  const int ps = cache_.page_size();
  int rows = 0;
  for (const Piece& p : pieces) rows += p.end - p.begin;
  chunk_meta_.resize(3 * static_cast<size_t>(rows));
  int32_t* const tokens = chunk_meta_.data();
  int32_t* const positions = tokens + rows;
  int32_t* const slots = tokens + 2 * rows;
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
    if (s.bidirectional) {
      masks[i] = AllVisibleMask(p.end);
    } else if (!chain) {
      masks[i] = AncestorMask(absl::MakeConstSpan(s.parents).subspan(0, p.end));
    }
    descs[i].bidirectional = s.bidirectional;
    descs[i].pages = pages[i];
    descs[i].prefix_len = s.committed_len;
    descs[i].num_nodes = p.end;
    descs[i].first_query = p.begin;
    descs[i].ancestor_mask = masks[i];
  }
  return OnRanks([&](ModelShard& shard) -> absl::Status {
    RETURN_IF_ERROR(shard.Forward(tokens, rows, descs));
    return after(shard);
  });
}

void CudaCausalLm::Commit(SeqId seq, int committed_len, absl::Span<const int> path) {
  const std::vector<int> pages = CheckCommitPath(cache_, seq, committed_len, path);
  bool moves = false;
  for (size_t j = 1; j < path.size(); ++j) moves = moves || path[j] != static_cast<int>(j);
  if (moves) {
    if (path.size() > size_t{kMaxPath}) Fatal("CudaCausalLm::Commit: path longer than 1024 nodes");
    const int n = static_cast<int>(path.size());
    const int np = static_cast<int>(pages.size());
    // [committed, path_len, path...][page offsets 0, np][pages...]
    absl::Status status = WaitStaged();
    if (status.ok()) {
      int32_t* m = staging_.ints();
      m[0] = committed_len;
      m[1] = n;
      std::copy(path.begin(), path.end(), m + 2);
      m[2 + n] = 0;
      m[3 + n] = np;
      std::copy(pages.begin(), pages.end(), m + 4 + n);
      status = OnRanks([&](ModelShard& shard) -> absl::Status {
        RETURN_IF_ERROR(shard.CommitPath(m, n, np));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(shard.stream()));
        return absl::OkStatus();
      });
    }
    // The interface has no error path (a CUDA failure here leaves the cache unusable).
    if (!status.ok()) Fatal(absl::StrCat("CudaCausalLm::Commit: ", status.ToString()));
  }
  cache_.Truncate(seq, committed_len + static_cast<int>(path.size()));
}

absl::Status ValidateOptions(const ModelConfig& c, const LmOptions& o, const CudaLmOptions& g) {
  RETURN_IF_ERROR(CudaSupportsLayers(c));
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
                                    std::pair{"intermediate_size", c.intermediate_size},
                                    std::pair{"context_width", c.context_width}}) {
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

// The rank devices: cuda.devices, or tp consecutive ordinals from cuda.device.
absl::StatusOr<std::vector<int>> RankDevices(const LmOptions& o, const CudaLmOptions& g) {
  std::vector<int> devices = g.devices;
  if (devices.empty()) {
    for (int r = 0; r < o.tensor_parallel; ++r) devices.push_back(g.device + r);
  }
  if (static_cast<int>(devices.size()) != o.tensor_parallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: tensor_parallel ", o.tensor_parallel, " but ", devices.size(),
                     " GPUs listed (", absl::StrJoin(devices, ","), "); one GPU per rank"));
  }
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  for (size_t r = 0; r < devices.size(); ++r) {
    if (devices[r] < 0 || devices[r] >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA backend: device ", devices[r], " not in [0, ", count, ")"));
    }
    if (std::count(devices.begin(), devices.end(), devices[r]) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: device ", devices[r], " listed twice (one tensor-parallel rank per GPU)"));
    }
  }
  return devices;
}

}  // namespace

absl::Status CudaSupportsLayers(const ModelConfig& config) {
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerSpec spec = LayerSpecOf(config, l);
    if (spec.attention != AttentionKind::kGqa || spec.mlp != MlpKind::kDense) {
      return absl::UnimplementedError(
          absl::StrCat("CUDA backend: ", config.architecture, " layer ", l, " has ",
                       spec.attention == AttentionKind::kMla ? "multi-head latent attention"
                                                             : "a mixture-of-experts MLP",
                       ", which only the CPU backend runs so far; use --device=cpu"));
    }
  }
  return absl::OkStatus();
}

double LastVerifyStepDeviceMs(const CausalLm& model) {
  const auto* cuda = dynamic_cast<const CudaCausalLm*>(&model);
  return cuda != nullptr ? cuda->last_step_device_ms() : -1.0;
}

int GemmPlanCount(const CausalLm& model) {
  const auto* cuda = dynamic_cast<const CudaCausalLm*>(&model);
  return cuda != nullptr ? cuda->shard(0).gemm_plan_count() : -1;
}

absl::Status SetOpTiming(CausalLm& model, bool on) {
  auto* cuda = dynamic_cast<CudaCausalLm*>(&model);
  if (cuda == nullptr) return absl::FailedPreconditionError("op timing: not a CUDA model");
  return cuda->shard(0).SetOpTiming(on);
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeOpTimes(CausalLm& model) {
  auto* cuda = dynamic_cast<CudaCausalLm*>(&model);
  if (cuda == nullptr) return absl::FailedPreconditionError("op timing: not a CUDA model");
  ASSIGN_OR_RETURN(const std::vector<double> ms, cuda->shard(0).TakeOpTimes());
  std::vector<std::pair<std::string, double>> out;
  for (int op = static_cast<int>(ShardOp::kStart) + 1; op < static_cast<int>(ShardOp::kCount);
       ++op) {
    out.push_back({ShardOpName(static_cast<ShardOp>(op)), ms[op]});
  }
  return out;
}

bool CudaDeviceAvailable() { return CudaDeviceCount() > 0; }

int CudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

namespace {

absl::StatusOr<std::unique_ptr<CausalLm>> Create(
    const ModelConfig& config, const LmOptions& options, const CudaLmOptions& cuda,
    const std::function<TensorSource(cudaStream_t)>& source) {
  RETURN_IF_ERROR(ValidateOptions(config, options, cuda));
  RETURN_IF_ERROR(MakeTpPlan(config, options.tensor_parallel).status());  // checks tp
  ASSIGN_OR_RETURN(std::vector<int> devices, RankDevices(options, cuda));
  const int64_t pages = options.kv_pages > 0
                            ? options.kv_pages
                            : static_cast<int64_t>(options.max_batch) *
                                  ((config.max_position_embeddings + options.kv_page_size - 1) /
                                   options.kv_page_size);
  if (pages > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: ", pages, " KV pages is too many"));
  }
  auto lm =
      std::make_unique<CudaCausalLm>(config, options, std::move(devices), static_cast<int>(pages));
  RETURN_IF_ERROR(lm->Init(cuda, source));
  return std::unique_ptr<CausalLm>(std::move(lm));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CausalLm>> CreateCudaCausalLm(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const LmOptions& options,
                                                             const CudaLmOptions& cuda) {
  return Create(config, options, cuda, [&](cudaStream_t) { return HostTensors(config, weights); });
}

absl::StatusOr<std::unique_ptr<CausalLm>> CreateRandomCudaCausalLm(const ModelConfig& config,
                                                                   uint64_t seed,
                                                                   const LmOptions& options,
                                                                   const CudaLmOptions& cuda,
                                                                   RandomStyle style) {
  return Create(config, options, cuda,
                [&](cudaStream_t stream) { return RandomTensors(config, seed, stream, style); });
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadCudaCausalLm(const std::string& model_dir,
                                                           const LmOptions& options,
                                                           const CudaLmOptions& cuda) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
  RETURN_IF_ERROR(CudaSupportsLayers(config));  // before reading a checkpoint it cannot run
  ASSIGN_OR_RETURN(const ModelWeights weights, LoadModelWeights(model_dir, config));
  return CreateCudaCausalLm(config, weights, options, cuda);
}

}  // namespace treespec::gpu
