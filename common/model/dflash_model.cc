#include "common/model/dflash_model.h"

#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/cpu_ops.h"
#include "common/model/dtype.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

// y [m, n] = x [m, k] · wᵀ for a Hugging Face [n, k] weight.
std::vector<float> Project(const std::vector<float>& x, int m, const Tensor& w) {
  const int n = static_cast<int>(w.shape()[0]);
  const int k = static_cast<int>(w.shape()[1]);
  std::vector<float> y(static_cast<size_t>(m) * n);
  MatMul(x.data(), w.data(), m, n, k, y.data());
  return y;
}

// RMSNorm over each head_dim slice of x [m, heads × head_dim], in place.
void HeadNorm(const Tensor& weight, int m, int heads, int head_dim, float eps,
              std::vector<float>& x) {
  RmsNorm(x.data(), weight.data(), m * heads, head_dim, eps, x.data());
}

}  // namespace

CpuDflashModel::CpuDflashModel(DflashConfig config, DflashWeights weights)
    : config_(std::move(config)),
      w_(std::move(weights)),
      inv_freq_(RopeInverseFrequencies(config_.body)) {}

absl::StatusOr<std::unique_ptr<CpuDflashModel>> CpuDflashModel::Load(
    const std::string& drafter_dir, const std::string& target_dir) {
  ASSIGN_OR_RETURN(DflashConfig config, LoadDflashConfig(drafter_dir));
  ASSIGN_OR_RETURN(DflashWeights weights, LoadDflashWeights(drafter_dir, config, target_dir));
  return std::make_unique<CpuDflashModel>(std::move(config), std::move(weights));
}

absl::Status CpuDflashModel::Append(DflashContext& context, const TargetFeatures& rows) const {
  const ModelConfig& c = config_.body;
  const int width = config_.features().width();
  if (rows.empty()) return absl::OkStatus();
  if (rows.width != width) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash context rows are ", rows.width,
                                                   " values wide; this drafter reads ", width));
  }
  const int n = rows.rows;
  std::vector<float> x(rows.bf16.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = Bf16BitsToFloat(rows.bf16[i]);
  std::vector<float> h = Project(x, n, w_.fc);
  RmsNorm(h.data(), w_.hidden_norm.data(), n, c.hidden_size, c.rms_norm_eps, h.data());
  std::vector<int> positions(n);
  std::iota(positions.begin(), positions.end(), context.rows);
  const int half = c.head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(n) * half), sin(cos.size());
  RopeTables(inv_freq_, c.rope_scaling.attention_factor, positions, cos.data(), sin.data());
  context.k.resize(c.num_layers);
  context.v.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    std::vector<float> k = Project(h, n, lw.wk);
    HeadNorm(lw.k_norm, n, c.num_kv_heads, c.head_dim, c.rms_norm_eps, k);
    ApplyRope(cos.data(), sin.data(), n, c.num_kv_heads, c.head_dim, k.data());
    const std::vector<float> v = Project(h, n, lw.wv);
    context.k[l].insert(context.k[l].end(), k.begin(), k.end());
    context.v[l].insert(context.v[l].end(), v.begin(), v.end());
  }
  context.rows += n;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CpuDflashModel::BlockLogits(const DflashContext& context,
                                                               int32_t bonus, int block) const {
  const ModelConfig& c = config_.body;
  if (bonus < 0 || bonus >= c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bonus token ", bonus, " is outside the vocabulary [0, ", c.vocab_size, ")"));
  }
  if (block < 2) return absl::InvalidArgumentError(absl::StrCat("block must be >= 2, got ", block));
  const int hidden = c.hidden_size;
  const int hd = c.head_dim;
  const int q_width = c.num_q_heads * hd;
  const int kv_width = c.num_kv_heads * hd;
  const int group = c.num_q_heads / c.num_kv_heads;
  const int ctx = context.rows;
  const int keys = ctx + block;

  std::vector<float> hs(static_cast<size_t>(block) * hidden);
  for (int i = 0; i < block; ++i) {
    const int32_t token = i == 0 ? bonus : config_.mask_token_id;
    std::copy_n(w_.embed.data() + static_cast<size_t>(token) * hidden, hidden,
                hs.data() + static_cast<size_t>(i) * hidden);
  }
  std::vector<int> positions(block);
  std::iota(positions.begin(), positions.end(), ctx);
  std::vector<float> cos(static_cast<size_t>(block) * (hd / 2)), sin(cos.size());
  RopeTables(inv_freq_, c.rope_scaling.attention_factor, positions, cos.data(), sin.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  std::vector<float> x(hs.size()), attn(static_cast<size_t>(block) * q_width);
  std::vector<const float*> k_rows(keys), v_rows(keys);
  std::vector<float> scores(keys);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    RmsNorm(hs.data(), lw.input_norm.data(), block, hidden, c.rms_norm_eps, x.data());
    std::vector<float> q = Project(x, block, lw.wq);
    HeadNorm(lw.q_norm, block, c.num_q_heads, hd, c.rms_norm_eps, q);
    ApplyRope(cos.data(), sin.data(), block, c.num_q_heads, hd, q.data());
    std::vector<float> k = Project(x, block, lw.wk);
    HeadNorm(lw.k_norm, block, c.num_kv_heads, hd, c.rms_norm_eps, k);
    ApplyRope(cos.data(), sin.data(), block, c.num_kv_heads, hd, k.data());
    const std::vector<float> v = Project(x, block, lw.wv);
    // Keys and values: the context's rows, then the block's.
    for (int j = 0; j < keys; ++j) {
      const bool in_ctx = j < ctx;
      k_rows[j] = in_ctx ? context.k[l].data() + static_cast<size_t>(j) * kv_width
                         : k.data() + static_cast<size_t>(j - ctx) * kv_width;
      v_rows[j] = in_ctx ? context.v[l].data() + static_cast<size_t>(j) * kv_width
                         : v.data() + static_cast<size_t>(j - ctx) * kv_width;
    }
    for (int i = 0; i < block; ++i) {
      for (int head = 0; head < c.num_q_heads; ++head) {
        const int kv_offset = (head / group) * hd;
        const float* qi = q.data() + static_cast<size_t>(i) * q_width + head * hd;
        DotRows(qi, k_rows.data(), kv_offset, keys, hd, scores.data());
        for (float& s : scores) s *= scale;
        SoftmaxInPlace(absl::MakeSpan(scores));
        WeightedSumRows(scores.data(), v_rows.data(), kv_offset, keys, hd,
                        attn.data() + static_cast<size_t>(i) * q_width + head * hd);
      }
    }
    const std::vector<float> o = Project(attn, block, lw.wo);
    AddInPlace(o.data(), static_cast<int64_t>(o.size()), hs.data());
    RmsNorm(hs.data(), lw.post_norm.data(), block, hidden, c.rms_norm_eps, x.data());
    std::vector<float> gate = Project(x, block, lw.w_gate);
    const std::vector<float> up = Project(x, block, lw.w_up);
    SiluMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), gate.data());
    const std::vector<float> down = Project(gate, block, lw.w_down);
    AddInPlace(down.data(), static_cast<int64_t>(down.size()), hs.data());
  }
  RmsNorm(hs.data(), w_.final_norm.data(), block, hidden, c.rms_norm_eps, hs.data());
  // Rows 1 .. block - 1 through the target's head.
  const std::vector<float> drafted(hs.begin() + hidden, hs.end());
  return Project(drafted, block - 1, w_.head());
}

}  // namespace treespec
