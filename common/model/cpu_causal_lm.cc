#include "common/model/cpu_causal_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/model/communicator.h"
#include "common/model/cpu_mlp.h"
#include "common/model/cpu_ops.h"
#include "common/model/dtype.h"
#include "common/model/forward_batch.h"
#include "common/model/kv_cache.h"
#include "common/model/tp_plan.h"
#include "common/model/tp_shard.h"
#include "common/model/tree_attention.h"
#include "common/tree/token_tree.h"
#include "common/util/rank_threads.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

// What every rank needs to run one Forward: built once by the caller, then read-only.
struct BatchPlan {
  struct Seq {
    std::vector<int> pages;      // page table, slots [0, L + n) reserved
    std::vector<uint64_t> mask;  // [n, ceil(n / 64)] ancestor bitmask
    int committed_len = 0;       // L
    int num_nodes = 0;           // n
    int first_new = 0;           // rows are nodes [first_new, n)
    int first_row = 0;           // the batch row of node first_new
  };
  std::vector<Seq> seqs;
  int num_rows = 0;              // M: new nodes in the batch
  std::vector<int32_t> tokens;   // [M]
  std::vector<int> slot_page;    // [M] page of the row's KV slot L + i
  std::vector<int> slot_offset;  // [M] offset in that page
  std::vector<float> rope_cos;   // [M, head_dim / 2] at position L + depth(i)
  std::vector<float> rope_sin;   // [M, head_dim / 2]
  float* logits = nullptr;       // [M, vocab] written by rank 0
  // Target features, when asked: [M, captured layers × hidden] bf16 bits written by rank 0,
  // and per layer its place in a row (-1: not captured).
  uint16_t* features = nullptr;
  std::vector<int> feature_slot;
};

// One tensor-parallel rank: its weights, its K/V and its scratch activations.
struct Rank {
  TpRankPlan plan;
  ModelWeights w;              // this rank's shard (tp_shard.h layout)
  std::unique_ptr<KvPool> kv;  // per layer: [pages, page_size, KvLayoutOf(layer)]
  std::unique_ptr<Communicator> comm;
  std::vector<int> kv_head_of_q;  // [rank q heads] index into this rank's KV heads

  // Activations, resized per batch (no allocation once the largest batch has been seen).
  std::vector<float> x;            // [M, hidden] residual stream
  std::vector<float> h;            // [M, hidden] normed input of a sublayer
  std::vector<float> q;            // [M, rank q heads, head_dim] (MLA: qk_head_dim)
  std::vector<float> k;            // [M, rank kv heads, head_dim]
  std::vector<float> v;            // [M, rank kv heads, head_dim]
  std::vector<float> attn;         // [M, rank q heads, head_dim] (MLA: kv_lora_rank)
  std::vector<float> out;          // [M, hidden] a sublayer's (partial) output
  std::vector<float> q_a;          // MLA: [M, q_lora_rank]
  std::vector<float> latent;       // MLA: [M, kv_lora_rank + qk_rope_head_dim]
  std::vector<float> q_latent;     // MLA: [M, rank q heads, kv_lora_rank + qk_rope_head_dim]
  std::vector<float> heads_out;    // MLA: [M, rank q heads, v_head_dim]
  MlpScratch mlp;                  // the MLP blocks' buffers
  std::vector<float> logits;       // [M, rank vocab] then [M, max vocab slice] padded
  std::vector<float> gathered;     // [tp, M, max vocab slice]
  TreeAttentionScratch attention;  // attention scratch
};

class CpuCausalLm final : public CausalLm {
 public:
  CpuCausalLm(const ModelConfig& config, const LmOptions& options, TpPlan plan, int num_pages)
      : config_(config),
        options_(options),
        plan_(std::move(plan)),
        cache_(num_pages, options.kv_page_size),
        inv_freq_(RopeInverseFrequencies(config)) {}

  // Takes the ranks over and starts a worker thread for each rank but the first.
  void Start(std::vector<std::unique_ptr<Rank>> ranks) {
    ranks_ = std::move(ranks);
    for (auto& r : ranks_) pools_.push_back(r->kv.get());
    threads_ = std::make_unique<RankThreads>(static_cast<int>(ranks_.size()));
  }

  const ModelConfig& config() const override { return config_; }
  int tensor_parallel() const override { return plan_.world_size(); }
  std::string device() const override { return "cpu"; }

  SeqId CreateSequence() override { return cache_.CreateSequence(); }
  void FreeSequence(SeqId seq) override { cache_.Free(seq); }
  PagedKvCache& kv_cache() override { return cache_; }

  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) override {
    return ForwardCapturing(batch, nullptr);
  }

  void Commit(SeqId seq, int committed_len, absl::Span<const int> path) override {
    CommitPath(cache_, pools_, seq, committed_len, path);
  }
  void Truncate(SeqId seq, int len) override { cache_.Truncate(seq, len); }
  absl::Status AppendContext(absl::Span<const ContextRows> batch) override;

 protected:
  absl::StatusOr<std::vector<float>> ForwardCapturing(absl::Span<const SeqTree> batch,
                                                      std::vector<uint16_t>* features) override;

 private:
  void BuildPlan(absl::Span<const SeqTree> batch, BatchPlan& plan) const;

  // The forward pass of one rank.
  void RankForward(Rank& r, const BatchPlan& b) const;
  void Embed(Rank& r, const BatchPlan& b) const;
  // The blocks of a layer (LayerSpecOf): each reads r.h [M, hidden] and leaves this rank's
  // part of its output in r.out [M, hidden], which RankForward all-reduces.
  void GqaAttention(Rank& r, const BatchPlan& b, int layer) const;
  void MlaAttention(Rank& r, const BatchPlan& b, int layer) const;
  void DenseMlp(Rank& r, int num_rows, int layer) const;
  void LmHead(Rank& r, const BatchPlan& b) const;
  void CaptureFeatures(const Rank& r, const BatchPlan& b, int layer) const;
  // Layer `layer`'s K/V of `rows` input rows x [rows, hidden] for this rank's heads, into the
  // pool at the rows' slots: k = RoPE(k_norm(x · Wkᵀ + bk)), v = x · Wvᵀ + bv (r.k, r.v hold
  // them afterwards). The forward's x is the normed residual; AppendContext's is c.
  void ProjectKv(Rank& r, const float* x, int rows, int layer, const float* cos, const float* sin,
                 absl::Span<const int> slot_page, absl::Span<const int> slot_offset) const;
  // MLA: layer `layer`'s latent [c_kv, k_rope] of the batch's rows h into their cache slots
  // (r.latent holds it afterwards): c_kv = RMSNorm(h · W_kvaᵀ[:kv_lora_rank]),
  // k_rope = RoPE(h · W_kvaᵀ[kv_lora_rank:]).
  void ProjectLatent(Rank& r, const BatchPlan& b, int layer) const;
  // MLA: RoPE on `rows` rotary parts of qk_rope_head_dim values, `stride` apart; row i takes
  // the batch's row i / heads_per_row cos/sin. With rope_interleave the (d/2, 2) pairs are
  // regrouped into halves first, as Transformers does.
  void MlaRope(const BatchPlan& b, float* x, int rows, int heads_per_row, int stride) const;

  const ModelConfig config_;
  const LmOptions options_;
  const TpPlan plan_;
  PagedKvCache cache_;
  const std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<KvPool*> pools_;            // [tp] every rank's pool, for CommitPath
  std::unique_ptr<RankThreads> threads_;  // one thread per rank
};

// ---------------------------------------------------------------------------------------------
// The forward pass (one rank). Reads like the math; shapes are per rank.

// The aligned comments are the math; keep clang-format from collapsing them.
// clang-format off
void CpuCausalLm::RankForward(Rank& r, const BatchPlan& b) const {
  const int m = b.num_rows, hidden = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  r.h.resize(static_cast<size_t>(m) * hidden);
  r.out.resize(static_cast<size_t>(m) * hidden);

  Embed(r, b);                                                  // x = embed[tokens]
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& w = r.w.layers[l];
    const LayerSpec spec = LayerSpecOf(config_, l);
    RmsNorm(r.x.data(), w.input_norm.data(), m, hidden, eps, r.h.data());
    switch (spec.attention) {                                   // out = attention(h)
      case AttentionKind::kGqa: GqaAttention(r, b, l); break;
      case AttentionKind::kMla: MlaAttention(r, b, l); break;
    }
    r.comm->AllReduceSum(absl::MakeSpan(r.out));
    AddInPlace(r.out.data(), r.out.size(), r.x.data());         // x += out
    RmsNorm(r.x.data(), w.post_norm.data(), m, hidden, eps, r.h.data());
    switch (spec.mlp) {                                         // out = mlp(h)
      case MlpKind::kDense: DenseMlp(r, m, l); break;
      case MlpKind::kMoe:
        MoeMlp(config_, w.moe, r.plan, r.h.data(), m, r.mlp, r.out.data());
        break;
    }
    r.comm->AllReduceSum(absl::MakeSpan(r.out));
    AddInPlace(r.out.data(), r.out.size(), r.x.data());         // x += out
    CaptureFeatures(r, b, l);
  }
  RmsNorm(r.x.data(), r.w.final_norm.data(), m, hidden, eps, r.h.data());
  LmHead(r, b);                                                 // logits = h · headᵀ
}
// clang-format on

// The features of layer `layer` (the residual stream after it), rounded to bf16, into their
// place in every row, when the batch asks for them. Every rank holds the same x after the
// all-reduce; rank 0 copies.
void CpuCausalLm::CaptureFeatures(const Rank& r, const BatchPlan& b, int layer) const {
  if (b.features == nullptr || b.feature_slot[layer] < 0 || r.comm->rank() != 0) return;
  const int hidden = config_.hidden_size;
  const size_t width = feature_layers().size() * hidden;
  for (int i = 0; i < b.num_rows; ++i) {
    const float* from = r.x.data() + static_cast<size_t>(i) * hidden;
    uint16_t* to = b.features + i * width + static_cast<size_t>(b.feature_slot[layer]) * hidden;
    for (int c = 0; c < hidden; ++c) to[c] = FloatToBf16Bits(from[c]);
  }
}

// x [M, hidden] = embed[tokens]. Vocab-parallel: a rank fills the rows of the tokens in its
// slice and zeros elsewhere; the all-reduce adds exact zeros, so every TP size gets the same x.
void CpuCausalLm::Embed(Rank& r, const BatchPlan& b) const {
  const int hidden = config_.hidden_size;
  r.x.assign(static_cast<size_t>(b.num_rows) * hidden, 0.0f);
  for (int i = 0; i < b.num_rows; ++i) {
    const int32_t t = b.tokens[i];
    if (t < r.plan.vocab_begin || t >= r.plan.vocab_end) continue;
    const float* row = r.w.embed.row(t - r.plan.vocab_begin);  // [hidden]
    std::copy(row, row + hidden, r.x.begin() + static_cast<size_t>(i) * hidden);
  }
  r.comm->AllReduceSum(absl::MakeSpan(r.x));
}

// out [M, hidden] = o_proj(tree attention of h [M, hidden]) over this rank's heads; writes the
// new nodes' K/V to their slots first.
void CpuCausalLm::GqaAttention(Rank& r, const BatchPlan& b, int layer) const {
  const GqaWeights& w = r.w.layers[layer].gqa;
  const int m = b.num_rows, hidden = config_.hidden_size, d = config_.head_dim;
  const int hq = r.plan.num_q_heads(), hkv = r.plan.num_kv_heads();
  r.q.resize(static_cast<size_t>(m) * hq * d);
  r.attn.resize(static_cast<size_t>(m) * hq * d);

  MatMul(r.h.data(), w.wq.data(), m, hq * d, hidden, r.q.data());     // q = h · Wqᵀ
  if (config_.qkv_bias) AddBias(w.bq.data(), m, hq * d, r.q.data());  // Qwen2
  if (config_.qk_norm) {                                              // Qwen3: per head
    RmsNorm(r.q.data(), w.q_norm.data(), m * hq, d, config_.rms_norm_eps, r.q.data());
  }
  ApplyRope(b.rope_cos.data(), b.rope_sin.data(), m, hq, d, r.q.data());
  ProjectKv(r, r.h.data(), m, layer, b.rope_cos.data(), b.rope_sin.data(), b.slot_page,
            b.slot_offset);  // cache[L + i] = k, v

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const AttentionHeads heads{r.kv_head_of_q, d, d};
  for (const BatchPlan::Seq& s : b.seqs) {
    TreeAttentionSeq view{s.pages, s.committed_len, s.num_nodes, s.first_new, s.mask};
    const size_t row0 = static_cast<size_t>(s.first_row) * hq * d;
    TreeAttention(*r.kv, layer, options_.kv_page_size, view, heads, scale, r.q.data() + row0,
                  r.attn.data() + row0, &r.attention);
  }
  MatMul(r.attn.data(), w.wo.data(), m, hidden, hq * d, r.out.data());  // out = attn · Woᵀ
}

void CpuCausalLm::ProjectKv(Rank& r, const float* x, int rows, int layer, const float* cos,
                            const float* sin, absl::Span<const int> slot_page,
                            absl::Span<const int> slot_offset) const {
  const GqaWeights& w = r.w.layers[layer].gqa;
  const int hidden = config_.hidden_size, d = config_.head_dim, hkv = r.plan.num_kv_heads();
  r.k.resize(static_cast<size_t>(rows) * hkv * d);
  r.v.resize(static_cast<size_t>(rows) * hkv * d);
  MatMul(x, w.wk.data(), rows, hkv * d, hidden, r.k.data());  // k = x · Wkᵀ
  MatMul(x, w.wv.data(), rows, hkv * d, hidden, r.v.data());  // v = x · Wvᵀ
  if (config_.qkv_bias) {
    AddBias(w.bk.data(), rows, hkv * d, r.k.data());
    AddBias(w.bv.data(), rows, hkv * d, r.v.data());
  }
  if (config_.qk_norm) {
    RmsNorm(r.k.data(), w.k_norm.data(), rows * hkv, d, config_.rms_norm_eps, r.k.data());
  }
  ApplyRope(cos, sin, rows, hkv, d, r.k.data());
  const size_t kv_width = static_cast<size_t>(hkv) * d;
  for (int i = 0; i < rows; ++i) {
    std::copy_n(r.k.data() + i * kv_width, kv_width, r.kv->K(layer, slot_page[i], slot_offset[i]));
    std::copy_n(r.v.data() + i * kv_width, kv_width, r.kv->V(layer, slot_page[i], slot_offset[i]));
  }
}

// out [M, hidden] = o_proj(MLA of h [M, hidden]) over this rank's heads, in the absorbed form
// (the form the cache is made for: attention runs over the latent, never over per-head K/V):
//   q_latent[h] = [W_uk[h]ᵀ · q_nope[h], RoPE(q_rope[h])]             [kv_lora_rank + rope]
//   a[h] = softmax(q_latent[h] · [c_kv, k_rope]ᵀ · scale) · c_kv        [kv_lora_rank]
//   o[h] = W_uv[h] · a[h]                                               [v_head_dim]
// which equals Transformers' decompressed form, since head h's key is [W_uk[h] c_kv, k_rope]
// and its value W_uv[h] c_kv. The latent is written to the rows' slots first.
void CpuCausalLm::MlaAttention(Rank& r, const BatchPlan& b, int layer) const {
  const MlaWeights& w = r.w.layers[layer].mla;
  const MlaConfig& mc = config_.mla;
  const int m = b.num_rows, hidden = config_.hidden_size, hq = r.plan.num_q_heads();
  const int nope = mc.qk_nope_head_dim, qk = mc.qk_head_dim(), lora = mc.kv_lora_rank;
  const int width = mc.latent_width(), vd = mc.v_head_dim, ql = mc.q_lora_rank;
  r.q.resize(static_cast<size_t>(m) * hq * qk);
  if (ql == 0) {
    MatMul(r.h.data(), w.wq.data(), m, hq * qk, hidden, r.q.data());  // q = h · Wqᵀ
  } else {                                                            // q = q_b(norm(q_a(h)))
    r.q_a.resize(static_cast<size_t>(m) * ql);
    MatMul(r.h.data(), w.wq_a.data(), m, ql, hidden, r.q_a.data());
    RmsNorm(r.q_a.data(), w.q_a_norm.data(), m, ql, config_.rms_norm_eps, r.q_a.data());
    MatMul(r.q_a.data(), w.wq_b.data(), m, hq * qk, ql, r.q.data());
  }
  MlaRope(b, r.q.data() + nope, m * hq, hq, qk);  // q_rope of every head
  ProjectLatent(r, b, layer);                     // cache[L + i] = [c_kv, k_rope]

  // Absorbed queries: q_latent[i, h] = [Σ_j q_nope[i, h, j] · W_uk[h][j, :], q_rope[i, h]].
  r.q_latent.resize(static_cast<size_t>(m) * hq * width);
  std::vector<const float*> w_uk(nope);
  for (int h = 0; h < hq; ++h) {
    for (int j = 0; j < nope; ++j) {
      w_uk[j] = w.wkv_b.data() + (static_cast<size_t>(h) * (nope + vd) + j) * lora;
    }
    for (int i = 0; i < m; ++i) {
      const float* q = r.q.data() + (static_cast<size_t>(i) * hq + h) * qk;
      float* to = r.q_latent.data() + (static_cast<size_t>(i) * hq + h) * width;
      WeightedSumRows(q, w_uk.data(), 0, nope, lora, to);
      std::copy_n(q + nope, mc.qk_rope_head_dim, to + lora);
    }
  }

  r.attn.resize(static_cast<size_t>(m) * hq * lora);
  const std::vector<int> one_entry(hq, 0);  // every head reads the one latent entry
  const AttentionHeads heads{one_entry, width, lora, /*values_in_keys=*/true};
  for (const BatchPlan::Seq& s : b.seqs) {
    TreeAttentionSeq view{s.pages, s.committed_len, s.num_nodes, s.first_new, s.mask};
    const size_t row0 = static_cast<size_t>(s.first_row) * hq;
    TreeAttention(*r.kv, layer, options_.kv_page_size, view, heads, mc.softmax_scale,
                  r.q_latent.data() + row0 * width, r.attn.data() + row0 * lora, &r.attention);
  }

  // o[i, h] = W_uv[h] · a[i, h]; out = o · Woᵀ.
  r.heads_out.resize(static_cast<size_t>(m) * hq * vd);
  for (int h = 0; h < hq; ++h) {
    const float* w_uv = w.wkv_b.data() + (static_cast<size_t>(h) * (nope + vd) + nope) * lora;
    for (int i = 0; i < m; ++i) {
      const size_t at = static_cast<size_t>(i) * hq + h;
      MatMul(r.attn.data() + at * lora, w_uv, 1, vd, lora, r.heads_out.data() + at * vd);
    }
  }
  MatMul(r.heads_out.data(), w.wo.data(), m, hidden, hq * vd, r.out.data());
}

void CpuCausalLm::ProjectLatent(Rank& r, const BatchPlan& b, int layer) const {
  const MlaWeights& w = r.w.layers[layer].mla;
  const int m = b.num_rows, lora = config_.mla.kv_lora_rank, width = config_.mla.latent_width();
  r.latent.resize(static_cast<size_t>(m) * width);
  MatMul(r.h.data(), w.wkv_a.data(), m, width, config_.hidden_size, r.latent.data());
  for (int i = 0; i < m; ++i) {
    float* row = r.latent.data() + static_cast<size_t>(i) * width;
    RmsNorm(row, w.kv_a_norm.data(), 1, lora, config_.rms_norm_eps, row);  // c_kv
  }
  MlaRope(b, r.latent.data() + lora, m, 1, width);  // k_rope
  for (int i = 0; i < m; ++i) {
    std::copy_n(r.latent.data() + static_cast<size_t>(i) * width, width,
                r.kv->K(layer, b.slot_page[i], b.slot_offset[i]));
  }
}

void CpuCausalLm::MlaRope(const BatchPlan& b, float* x, int rows, int heads_per_row,
                          int stride) const {
  const int d = config_.mla.qk_rope_head_dim, half = d / 2;
  std::vector<float> pairs(d);
  for (int i = 0; i < rows; ++i) {
    float* part = x + static_cast<size_t>(i) * stride;
    if (config_.mla.rope_interleave) {  // [x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]
      for (int f = 0; f < half; ++f) {
        pairs[f] = part[2 * f];
        pairs[half + f] = part[2 * f + 1];
      }
      std::copy(pairs.begin(), pairs.end(), part);
    }
    const size_t row = static_cast<size_t>(i / heads_per_row) * half;
    ApplyRope(b.rope_cos.data() + row, b.rope_sin.data() + row, 1, 1, d, part);
  }
}

// out [M, hidden] = down(silu(gate(h)) * up(h)) over this rank's MLP columns.
void CpuCausalLm::DenseMlp(Rank& r, int m, int layer) const {
  GatedMlp(r.w.layers[layer].mlp, r.h.data(), m, config_.hidden_size, r.plan.mlp_width(), r.mlp,
           r.out.data());
}

// Logits of this rank's vocab slice, gathered into b.logits [M, vocab] on rank 0.
void CpuCausalLm::LmHead(Rank& r, const BatchPlan& b) const {
  const int m = b.num_rows, hidden = config_.hidden_size, vr = r.plan.vocab_size();
  const Tensor& head = config_.tie_word_embeddings ? r.w.embed : r.w.lm_head;  // [vr, hidden]
  const int tp = plan_.world_size();
  if (tp == 1) {
    MatMul(r.h.data(), head.data(), m, vr, hidden, b.logits);
    return;
  }
  const int width = plan_.max_vocab_slice();
  r.logits.resize(static_cast<size_t>(m) * width);
  MatMul(r.h.data(), head.data(), m, vr, hidden, r.logits.data());  // [M, vr]
  for (int i = m - 1; i >= 0; --i) {                                // pad rows to `width`
    std::copy_backward(r.logits.begin() + static_cast<size_t>(i) * vr,
                       r.logits.begin() + static_cast<size_t>(i + 1) * vr,
                       r.logits.begin() + static_cast<size_t>(i) * width + vr);
  }
  r.gathered.resize(static_cast<size_t>(tp) * m * width);
  r.comm->AllGather(r.logits, absl::MakeSpan(r.gathered));  // [tp, M, width]
  if (r.comm->rank() != 0) return;
  const int vocab = config_.vocab_size;
  for (int src = 0; src < tp; ++src) {
    const TpRankPlan& p = plan_.ranks[src];
    for (int i = 0; i < m; ++i) {
      const float* from = r.gathered.data() + (static_cast<size_t>(src) * m + i) * width;
      std::copy_n(from, p.vocab_size(), b.logits + static_cast<size_t>(i) * vocab + p.vocab_begin);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Batch planning (the calling thread).

void CpuCausalLm::BuildPlan(absl::Span<const SeqTree> batch, BatchPlan& plan) const {
  const int half = config_.head_dim / 2, ps = options_.kv_page_size;
  std::vector<int> positions;
  for (const SeqTree& s : batch) {
    BatchPlan::Seq seq;
    seq.pages = cache_.Pages(s.seq);
    seq.mask = s.bidirectional ? AllVisibleMask(static_cast<int>(s.tokens.size()))
                               : AncestorMask(s.parents);
    seq.committed_len = s.committed_len;
    seq.num_nodes = static_cast<int>(s.tokens.size());
    seq.first_new = s.first_new;
    seq.first_row = plan.num_rows;
    const std::vector<int32_t> depth = NodeDepths(s.parents);
    for (int i = s.first_new; i < seq.num_nodes; ++i) {
      const int slot = s.committed_len + i;
      plan.tokens.push_back(s.tokens[i]);
      plan.slot_page.push_back(seq.pages[slot / ps]);
      plan.slot_offset.push_back(slot % ps);
      positions.push_back(s.committed_len + depth[i]);
    }
    plan.num_rows += seq.num_nodes - seq.first_new;
    plan.seqs.push_back(std::move(seq));
  }
  plan.rope_cos.resize(static_cast<size_t>(plan.num_rows) * half);
  plan.rope_sin.resize(static_cast<size_t>(plan.num_rows) * half);
  RopeTables(inv_freq_, config_.rope_scaling.attention_factor, positions, plan.rope_cos.data(),
             plan.rope_sin.data());
}

absl::StatusOr<std::vector<float>> CpuCausalLm::ForwardCapturing(absl::Span<const SeqTree> batch,
                                                                 std::vector<uint16_t>* features) {
  RETURN_IF_ERROR(ValidateForwardBatch(config_, cache_, batch));
  RETURN_IF_ERROR(ReserveForwardBatch(cache_, batch));
  BatchPlan plan;
  BuildPlan(batch, plan);
  std::vector<float> logits(static_cast<size_t>(plan.num_rows) * config_.vocab_size);
  if (features != nullptr) {
    features->assign(
        static_cast<size_t>(plan.num_rows) * feature_layers().size() * config_.hidden_size, 0);
    plan.features = features->data();
    plan.feature_slot.assign(config_.num_layers, -1);
    for (size_t i = 0; i < feature_layers().size(); ++i) {
      plan.feature_slot[feature_layers()[i]] = static_cast<int>(i);
    }
  }
  if (plan.num_rows == 0) return logits;
  plan.logits = logits.data();
  threads_->Run([&](int rank) { RankForward(*ranks_[rank], plan); });
  return logits;
}

absl::Status CpuCausalLm::AppendContext(absl::Span<const ContextRows> batch) {
  RETURN_IF_ERROR(ReserveContextRows(config_, cache_, batch));
  const int hidden = config_.hidden_size, ps = options_.kv_page_size;
  // Every entry's rows as one [n, width] matrix, with each row's position and slot.
  std::vector<float> x;
  std::vector<int> positions, slot_page, slot_offset;
  for (const ContextRows& e : batch) {
    const std::vector<int> pages = cache_.Pages(e.seq);
    for (int i = 0; i < e.rows->rows; ++i) {
      const int slot = e.committed_len + i;
      positions.push_back(slot);
      slot_page.push_back(pages[slot / ps]);
      slot_offset.push_back(slot % ps);
    }
    for (const uint16_t v : e.rows->bf16) x.push_back(Bf16BitsToFloat(v));
  }
  const int n = static_cast<int>(positions.size());
  if (n == 0) return absl::OkStatus();
  // c = RMSNorm(rows · fcᵀ): the same on every rank (each holds the whole projection).
  const ModelWeights& w = ranks_[0]->w;
  std::vector<float> c(static_cast<size_t>(n) * hidden);
  MatMul(x.data(), w.context_fc.data(), n, hidden, config_.context_width, c.data());
  RmsNorm(c.data(), w.context_norm.data(), n, hidden, config_.rms_norm_eps, c.data());
  const int half = config_.head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(n) * half), sin(cos.size());
  RopeTables(inv_freq_, config_.rope_scaling.attention_factor, positions, cos.data(), sin.data());
  threads_->Run([&](int rank) {
    for (int l = 0; l < config_.num_layers; ++l) {
      ProjectKv(*ranks_[rank], c.data(), n, l, cos.data(), sin.data(), slot_page, slot_offset);
    }
  });
  return absl::OkStatus();
}

// What layer `spec` caches per slot on `rank`: its KV heads' K and V (GQA), or the one latent
// entry every head reads (MLA; replicated on every rank, see tp_shard.h).
KvLayout KvLayoutOf(const ModelConfig& c, const LayerSpec& spec, const TpRankPlan& rank) {
  switch (spec.attention) {
    case AttentionKind::kGqa: {
      const int width = rank.num_kv_heads() * c.head_dim;
      return {width, width};
    }
    case AttentionKind::kMla:
      return {c.mla.latent_width(), 0};
  }
  return {};
}

absl::Status ValidateConfig(const ModelConfig& c, const LmOptions& o) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (c.vocab_size < 1 || c.hidden_size < 1 || c.num_layers < 1 || c.head_dim < 2 ||
      c.head_dim % 2 != 0 || c.intermediate_size < 1 || c.num_q_heads < 1 || c.num_kv_heads < 1 ||
      c.max_position_embeddings < 1) {
    return bad("model config has a non-positive size or an odd head_dim (vocab ", c.vocab_size,
               ", hidden ", c.hidden_size, ", layers ", c.num_layers, ", head_dim ", c.head_dim,
               ", intermediate ", c.intermediate_size, ", heads ", c.num_q_heads, "/",
               c.num_kv_heads, ", context ", c.max_position_embeddings, ")");
  }
  if (c.attention == AttentionKind::kMla && c.context_width > 0) {
    return bad("a context projection (a DFlash drafter's body) needs GQA attention, not MLA");
  }
  if (o.kv_page_size < 1) return bad("kv_page_size must be positive, got ", o.kv_page_size);
  if (o.kv_pages < 0) return bad("kv_pages must be >= 0, got ", o.kv_pages);
  if (o.kv_pages == 0 && o.max_batch < 1) {
    return bad("max_batch must be positive to size the KV cache, got ", o.max_batch);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CausalLm>> CreateCpuCausalLm(const ModelConfig& config,
                                                            ModelWeights weights,
                                                            const LmOptions& options) {
  RETURN_IF_ERROR(ValidateConfig(config, options));
  RETURN_IF_ERROR(ValidateWeightShapes(config, weights));
  ASSIGN_OR_RETURN(TpPlan plan, MakeTpPlan(config, options.tensor_parallel));
  const int64_t pages_per_seq =
      (static_cast<int64_t>(config.max_position_embeddings) + options.kv_page_size - 1) /
      options.kv_page_size;
  const int64_t num_pages =
      options.kv_pages > 0 ? options.kv_pages : options.max_batch * pages_per_seq;
  if (num_pages > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache of ", num_pages, " pages is too large; set kv_pages"));
  }

  const int tp = plan.world_size();
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::unique_ptr<Communicator>> comms = CreateInProcessCommunicators(tp);
  for (int r = 0; r < tp; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->plan = plan.ranks[r];
    if (tp == 1) {
      rank->w = std::move(weights);
    } else {
      ASSIGN_OR_RETURN(rank->w, ShardWeights(config, weights, plan, r));
    }
    std::vector<KvLayout> layouts;
    for (int l = 0; l < config.num_layers; ++l) {
      layouts.push_back(KvLayoutOf(config, LayerSpecOf(config, l), rank->plan));
    }
    rank->kv = std::make_unique<KvPool>(std::move(layouts), static_cast<int>(num_pages),
                                        options.kv_page_size);
    rank->comm = std::move(comms[r]);
    for (int h = rank->plan.q_head_begin; h < rank->plan.q_head_end; ++h) {
      rank->kv_head_of_q.push_back(h / plan.group_size - rank->plan.kv_head_begin);
    }
    ranks.push_back(std::move(rank));
  }
  weights = ModelWeights();  // the shards are copies; release the full weights now

  auto lm =
      std::make_unique<CpuCausalLm>(config, options, std::move(plan), static_cast<int>(num_pages));
  lm->Start(std::move(ranks));
  return std::unique_ptr<CausalLm>(std::move(lm));
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadCpuCausalLm(const std::string& model_dir,
                                                          const LmOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(model_dir, config));
  return CreateCpuCausalLm(config, std::move(weights), options);
}

}  // namespace treespec
