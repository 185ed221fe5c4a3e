#include "common/model/cpu_causal_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/model/cpu_test_util.h"
#include "common/tree/token_tree.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using testing::RandomWeights;
using testing::SmallLlamaConfig;

constexpr uint64_t kSeed = 20240611;

ModelConfig Qwen2Config() {
  ModelConfig c = SmallLlamaConfig();
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;
  c.tie_word_embeddings = false;
  c.rope_theta = 1000000.0f;
  return c;
}

ModelConfig Qwen3Config() {
  ModelConfig c = SmallLlamaConfig();
  c.architecture = "Qwen3ForCausalLM";
  c.qk_norm = true;
  c.head_dim = 32;  // q width 256 != hidden 128, as Qwen3 allows
  c.rms_norm_eps = 1e-6f;
  return c;
}

// Uneven for every TP size tried: 14 q heads in GQA groups of 7, MLP 704 = 11 units of 64.
ModelConfig UnevenConfig() {
  ModelConfig c = SmallLlamaConfig();
  c.num_q_heads = 14;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_size = 224;
  c.intermediate_size = 704;
  c.vocab_size = 1000;
  c.num_layers = 3;
  return c;
}

// Yarn-style scaled RoPE: exercises the attention factor on cos/sin.
ModelConfig YarnConfig() {
  ModelConfig c = SmallLlamaConfig();
  c.rope_scaling.type = RopeScaling::Type::kYarn;
  c.rope_scaling.factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.rope_scaling.attention_factor = 1.1386294f;  // 0.1 ln 4 + 1
  return c;
}

using testing::SmallDeepseekConfig;

// MLA with a direct q_proj, no YaRN, plain rotate-half RoPE; MoE in every layer with one expert
// group, one shared expert and unnormalized weights.
ModelConfig DeepseekDirectQConfig() {
  ModelConfig c = SmallDeepseekConfig();
  c.mla.q_lora_rank = 0;
  c.mla.rope_interleave = false;
  c.rope_scaling = RopeScaling();
  c.mla.softmax_scale = 1.0f / 6.0f;  // qk_head_dim 36
  c.moe.num_groups = 1;
  c.moe.topk_groups = 1;
  c.moe.num_shared_experts = 1;
  c.moe.first_dense_layers = 0;
  c.moe.norm_topk_prob = false;
  c.moe.routed_scaling_factor = 1.0f;
  return c;
}

// No shared experts; two groups of four, one kept.
ModelConfig DeepseekNoSharedConfig() {
  ModelConfig c = SmallDeepseekConfig();
  c.moe.num_shared_experts = 0;
  c.moe.num_groups = 2;
  c.moe.topk_groups = 1;
  return c;
}

std::unique_ptr<CausalLm> MakeLm(const ModelConfig& c, int tp = 1, int kv_pages = 64,
                                 uint64_t seed = kSeed) {
  LmOptions o;
  o.tensor_parallel = tp;
  o.kv_pages = kv_pages;
  o.kv_page_size = 16;
  auto lm = CreateCpuCausalLm(c, RandomWeights(c, seed), o);
  EXPECT_TRUE(lm.ok()) << lm.status();
  return lm.ok() ? std::move(*lm) : nullptr;
}

std::vector<int32_t> ChainParents(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = i - 1;
  return p;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  return t;
}

// One root (node 0); every other node picks a random earlier parent.
std::vector<int32_t> RandomTreeParents(std::mt19937& rng, int n) {
  std::vector<int32_t> p(n, -1);
  for (int i = 1; i < n; ++i) p[i] = std::uniform_int_distribution<int32_t>(0, i - 1)(rng);
  return p;
}

std::vector<float> ForwardOk(CausalLm& lm, std::vector<SeqTree> batch) {
  auto out = lm.Forward(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<float>();
}

// Feeds `tokens` as one chain after `committed` tokens and commits them all.
std::vector<float> Prefill(CausalLm& lm, SeqId seq, const std::vector<int32_t>& tokens,
                           int committed = 0) {
  const int n = static_cast<int>(tokens.size());
  std::vector<float> logits = ForwardOk(lm, {{seq, committed, tokens, ChainParents(n), 0}});
  std::vector<int> path(n);
  for (int i = 0; i < n; ++i) path[i] = i;
  lm.Commit(seq, committed, path);
  return logits;
}

std::vector<float> Row(const std::vector<float>& logits, int row, int vocab) {
  return std::vector<float>(logits.begin() + static_cast<size_t>(row) * vocab,
                            logits.begin() + static_cast<size_t>(row + 1) * vocab);
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Largest |a - b| over a row, relative to the row's largest |b|.
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// ---------------------------------------------------------------------------------------------
// A naive causal forward in double precision straight from the Hugging Face definitions:
// dense attention over the whole sequence, no cache, no trees, no tensor parallelism.
// Returns logits [tokens, vocab].
std::vector<double> NaiveForward(const ModelConfig& c, const ModelWeights& w,
                                 const std::vector<int32_t>& tokens) {
  const int P = static_cast<int>(tokens.size()), D = c.hidden_size, d = c.head_dim;
  const int hq = c.num_q_heads, hkv = c.num_kv_heads;
  using Vec = std::vector<double>;
  auto linear = [](const Tensor& W, const Tensor& b, const Vec& x) {  // W [out, in]
    Vec y(W.dim(0), 0.0);
    for (int64_t o = 0; o < W.dim(0); ++o) {
      for (int64_t i = 0; i < W.dim(1); ++i) y[o] += static_cast<double>(W.row(o)[i]) * x[i];
      if (!b.empty()) y[o] += b.data()[o];
    }
    return y;
  };
  const Tensor none;
  auto rms = [&](const Vec& x, const float* weight, int begin, int n) {  // over x[begin, +n)
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += x[begin + i] * x[begin + i];
    const double inv = 1.0 / std::sqrt(ss / n + c.rms_norm_eps);
    Vec y(n);
    for (int i = 0; i < n; ++i) y[i] = weight[i] * x[begin + i] * inv;
    return y;
  };
  const std::vector<float> inv_freq = RopeInverseFrequencies(c);
  auto rope = [&](Vec& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h) {
      for (int f = 0; f < d / 2; ++f) {
        const float angle = static_cast<float>(pos) * inv_freq[f];  // fp32, as transformers
        const double cs = std::cos(static_cast<double>(angle)) * c.rope_scaling.attention_factor;
        const double sn = std::sin(static_cast<double>(angle)) * c.rope_scaling.attention_factor;
        const double a = v[h * d + f], b = v[h * d + f + d / 2];
        v[h * d + f] = a * cs - b * sn;
        v[h * d + f + d / 2] = b * cs + a * sn;
      }
    }
  };

  // MLA's rotary part: Transformers' interleaved layout regroups (d/2, 2) pairs into halves.
  auto mla_rope = [&](double* part, int pos) {
    const int half = d / 2;
    if (c.mla.rope_interleave) {
      Vec pairs(d);
      for (int f = 0; f < half; ++f) {
        pairs[f] = part[2 * f];
        pairs[half + f] = part[2 * f + 1];
      }
      std::copy(pairs.begin(), pairs.end(), part);
    }
    Vec one(part, part + d);
    rope(one, 1, pos);
    std::copy(one.begin(), one.end(), part);
  };
  auto gated = [&](const DenseMlpWeights& m, const Vec& h) {
    const Vec gate = linear(m.w_gate, none, h), up = linear(m.w_up, none, h);
    Vec act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
    return linear(m.w_down, none, act);
  };
  // The DeepSeek-V3 router and experts, written from Transformers' DeepseekV3MoE.
  auto moe = [&](const MoeWeights& m, const Vec& h) {
    const MoeConfig& e = c.moe;
    const Vec logits = linear(m.router, none, h);
    const int E = e.num_experts, per_group = E / e.num_groups;
    Vec score(E), choice(E);
    for (int i = 0; i < E; ++i) {
      score[i] = 1 / (1 + std::exp(-logits[i]));
      choice[i] = score[i] + m.score_bias.data()[i];
    }
    // Ranked by value, equal values by lower index (masked experts tie at 0.0).
    auto by_value = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < e.num_groups; ++g) {
      Vec in(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(in.rbegin(), in.rend());
      groups.push_back({in[0] + in[1], g});
    }
    std::sort(groups.begin(), groups.end(), by_value);
    for (int g = e.topk_groups; g < e.num_groups; ++g) {
      for (int i = 0; i < per_group; ++i) choice[groups[g].second * per_group + i] = 0.0;
    }
    std::vector<std::pair<double, int>> ranked;
    for (int i = 0; i < E; ++i) ranked.push_back({choice[i], i});
    std::sort(ranked.begin(), ranked.end(), by_value);
    double sum = 0;
    for (int j = 0; j < e.experts_per_token; ++j) sum += score[ranked[j].second];
    Vec out = gated(m.shared, h);
    for (int j = 0; j < e.experts_per_token; ++j) {
      const int x = ranked[j].second;
      const double weight =
          (e.norm_topk_prob ? score[x] / sum : score[x]) * e.routed_scaling_factor;
      const Vec y = gated(m.experts[x], h);
      for (int i = 0; i < D; ++i) out[i] += weight * y[i];
    }
    return out;
  };

  std::vector<Vec> x(P, Vec(D));
  for (int p = 0; p < P; ++p) {
    for (int i = 0; i < D; ++i) x[p][i] = w.embed.row(tokens[p])[i];
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const LayerSpec spec = LayerSpecOf(c, l);
    std::vector<Vec> attn(P);  // [P][hq * value width]: every position's heads, before o_proj
    if (spec.attention == AttentionKind::kMla) {
      // The decompressed form: per-head keys [k_nope, k_rope] and values from kv_b_proj.
      const MlaConfig& m = c.mla;
      const int nope = m.qk_nope_head_dim, qk = m.qk_head_dim(), vd = m.v_head_dim;
      std::vector<Vec> q(P), k(P), v(P);  // [hq * qk], [hq * qk], [hq * vd]
      for (int p = 0; p < P; ++p) {
        const Vec h = rms(x[p], lw.input_norm.data(), 0, D);
        q[p] = m.q_lora_rank == 0 ? linear(lw.mla.wq, none, h)
                                  : linear(lw.mla.wq_b, none,
                                           rms(linear(lw.mla.wq_a, none, h), lw.mla.q_a_norm.data(),
                                               0, m.q_lora_rank));
        Vec kv_a = linear(lw.mla.wkv_a, none, h);
        const Vec kv =
            linear(lw.mla.wkv_b, none, rms(kv_a, lw.mla.kv_a_norm.data(), 0, m.kv_lora_rank));
        mla_rope(kv_a.data() + m.kv_lora_rank, p);
        k[p].resize(hq * qk);
        v[p].resize(hq * vd);
        for (int hh = 0; hh < hq; ++hh) {
          mla_rope(q[p].data() + hh * qk + nope, p);
          for (int e = 0; e < nope; ++e) k[p][hh * qk + e] = kv[hh * (nope + vd) + e];
          for (int e = 0; e < d; ++e) k[p][hh * qk + nope + e] = kv_a[m.kv_lora_rank + e];
          for (int e = 0; e < vd; ++e) v[p][hh * vd + e] = kv[hh * (nope + vd) + nope + e];
        }
      }
      for (int p = 0; p < P; ++p) {
        attn[p].assign(hq * vd, 0.0);
        for (int hh = 0; hh < hq; ++hh) {
          Vec s(p + 1);
          double max = -INFINITY, sum = 0;
          for (int j = 0; j <= p; ++j) {
            s[j] = 0;
            for (int e = 0; e < qk; ++e) s[j] += q[p][hh * qk + e] * k[j][hh * qk + e];
            s[j] *= m.softmax_scale;
            max = std::max(max, s[j]);
          }
          for (double& e : s) sum += (e = std::exp(e - max));
          for (int j = 0; j <= p; ++j) {
            for (int e = 0; e < vd; ++e) attn[p][hh * vd + e] += s[j] / sum * v[j][hh * vd + e];
          }
        }
      }
    } else {
      std::vector<Vec> q(P), k(P), v(P);
      for (int p = 0; p < P; ++p) {
        const Vec h = rms(x[p], lw.input_norm.data(), 0, D);
        q[p] = linear(lw.gqa.wq, lw.gqa.bq, h);
        k[p] = linear(lw.gqa.wk, lw.gqa.bk, h);
        v[p] = linear(lw.gqa.wv, lw.gqa.bv, h);
        if (c.qk_norm) {
          for (int hh = 0; hh < hq; ++hh) {
            const Vec n = rms(q[p], lw.gqa.q_norm.data(), hh * d, d);
            std::copy(n.begin(), n.end(), q[p].begin() + hh * d);
          }
          for (int hh = 0; hh < hkv; ++hh) {
            const Vec n = rms(k[p], lw.gqa.k_norm.data(), hh * d, d);
            std::copy(n.begin(), n.end(), k[p].begin() + hh * d);
          }
        }
        rope(q[p], hq, p);
        rope(k[p], hkv, p);
      }
      for (int p = 0; p < P; ++p) {
        attn[p].assign(hq * d, 0.0);
        for (int hh = 0; hh < hq; ++hh) {
          const int g = hh / (hq / hkv);
          Vec s(p + 1);
          double max = -INFINITY, sum = 0;
          for (int j = 0; j <= p; ++j) {
            s[j] = 0;
            for (int e = 0; e < d; ++e) s[j] += q[p][hh * d + e] * k[j][g * d + e];
            s[j] /= std::sqrt(static_cast<double>(d));
            max = std::max(max, s[j]);
          }
          for (double& e : s) sum += (e = std::exp(e - max));
          for (int j = 0; j <= p; ++j) {
            for (int e = 0; e < d; ++e) attn[p][hh * d + e] += s[j] / sum * v[j][g * d + e];
          }
        }
      }
    }
    const Tensor& wo = spec.attention == AttentionKind::kMla ? lw.mla.wo : lw.gqa.wo;
    for (int p = 0; p < P; ++p) {
      const Vec o = linear(wo, none, attn[p]);
      for (int i = 0; i < D; ++i) x[p][i] += o[i];
      const Vec h = rms(x[p], lw.post_norm.data(), 0, D);
      const Vec down = spec.mlp == MlpKind::kMoe ? moe(lw.moe, h) : gated(lw.mlp, h);
      for (int i = 0; i < D; ++i) x[p][i] += down[i];
    }
  }
  const Tensor& head = c.tie_word_embeddings ? w.embed : w.lm_head;
  std::vector<double> logits;
  for (int p = 0; p < P; ++p) {
    const Vec h = rms(x[p], w.final_norm.data(), 0, D);
    const Vec row = linear(head, none, h);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

// fp32 against the double reference. Each matmul row carries at most (K/8 + 4)u relative
// error of Σ|terms| (cpu_ops_test derives it; K ≤ 320 here gives 44u ≈ 2.6e-6), attention and
// norms a few u more; with two residual updates per layer and the logits' Σ|terms| about 3×
// max|logit| for these weights, 2 layers stay well under 20 × 44u × 3 ≈ 1.6e-4. Observed:
// ~1e-6 (see the test output); the bound below is the derived one rounded to 1e-4.
constexpr double kFp32VsDoubleRel = 1e-4;

class NaiveReferenceTest : public ::testing::TestWithParam<int> {};

TEST_P(NaiveReferenceTest, PrefillMatchesNaiveDoubleForward) {
  const ModelConfig configs[] = {
      SmallLlamaConfig(),    Qwen2Config(),           Qwen3Config(),           YarnConfig(),
      SmallDeepseekConfig(), DeepseekDirectQConfig(), DeepseekNoSharedConfig()};
  const ModelConfig& c = configs[GetParam()];
  std::mt19937 rng(GetParam());
  const std::vector<int32_t> tokens = RandomTokens(rng, 40, c.vocab_size);
  auto lm = MakeLm(c);
  const std::vector<float> got = Prefill(*lm, lm->CreateSequence(), tokens);
  const std::vector<double> ref = NaiveForward(c, RandomWeights(c, kSeed), tokens);
  double worst = 0;
  for (int p = 0; p < 40; ++p) {
    const std::vector<float> row = Row(got, p, c.vocab_size);
    std::vector<float> ref_row(ref.begin() + p * c.vocab_size,
                               ref.begin() + (p + 1) * c.vocab_size);
    worst = std::max(worst, RelDiff(row, ref_row));
    // A meaningful comparison needs logits that are not ~0.
    ASSERT_GT(*std::max_element(ref_row.begin(), ref_row.end()), 1.0);
  }
  std::printf("%s: max |fp32 - double| / max|logit| = %.3g\n", c.architecture.c_str(), worst);
  EXPECT_LT(worst, kFp32VsDoubleRel);
}

INSTANTIATE_TEST_SUITE_P(Architectures, NaiveReferenceTest, ::testing::Range(0, 7));

// ---------------------------------------------------------------------------------------------
// Metamorphic invariants. All of them hold bit for bit (cpu_causal_lm.h says why).

TEST(CpuCausalLmTest, ChainPrefillEqualsTokenByTokenDecodeBitwise) {
  for (const ModelConfig& c :
       {SmallLlamaConfig(), Qwen2Config(), Qwen3Config(), SmallDeepseekConfig()}) {
    std::mt19937 rng(1);
    const std::vector<int32_t> tokens = RandomTokens(rng, 40, c.vocab_size);  // 3 pages
    auto lm = MakeLm(c);
    const std::vector<float> all = Prefill(*lm, lm->CreateSequence(), tokens);
    const SeqId seq = lm->CreateSequence();
    for (int i = 0; i < 40; ++i) {
      const std::vector<float> one = Prefill(*lm, seq, {tokens[i]}, i);  // a tree of size 1
      ASSERT_TRUE(BitEqual(one, Row(all, i, c.vocab_size)))
          << c.architecture << " position " << i << ", rel diff "
          << RelDiff(one, Row(all, i, c.vocab_size));
    }
  }
}

TEST(CpuCausalLmTest, TreeNodeEqualsCausalForwardOfItsPathBitwise) {
  for (const ModelConfig& c : {SmallLlamaConfig(), Qwen3Config(), SmallDeepseekConfig()}) {
    std::mt19937 rng(2);
    const int V = c.vocab_size;
    const std::vector<int32_t> prompt = RandomTokens(rng, 13, V);
    const std::vector<int32_t> tree_tokens = RandomTokens(rng, 24, V);
    const std::vector<int32_t> parents = RandomTreeParents(rng, 24);
    auto lm = MakeLm(c);
    const SeqId seq = lm->CreateSequence();
    Prefill(*lm, seq, prompt);
    const std::vector<float> tree = ForwardOk(*lm, {{seq, 13, tree_tokens, parents, 0}});
    for (int i = 0; i < 24; ++i) {
      std::vector<int32_t> path;
      for (int j = i; j >= 0; j = parents[j]) path.insert(path.begin(), tree_tokens[j]);
      std::vector<int32_t> seq_tokens = prompt;
      seq_tokens.insert(seq_tokens.end(), path.begin(), path.end());
      const SeqId alone = lm->CreateSequence();
      const std::vector<float> causal = Prefill(*lm, alone, seq_tokens);
      lm->FreeSequence(alone);
      ASSERT_TRUE(BitEqual(Row(tree, i, V), Row(causal, seq_tokens.size() - 1, V)))
          << c.architecture << " node " << i;
    }
  }
}

TEST(CpuCausalLmTest, CommitThenContinueEqualsDecodingTheAcceptedPath) {
  for (const ModelConfig& c : {SmallLlamaConfig(), SmallDeepseekConfig()}) {
    const int V = c.vocab_size;
    std::mt19937 rng(3);
    const std::vector<int32_t> prompt = RandomTokens(rng, 10, V);
    const std::vector<int32_t> tokens = RandomTokens(rng, 16, V);
    const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 2, 3, 4, 5, 5, 7, 9, 9, 10, 12, 12};
    auto lm = MakeLm(c);
    const SeqId seq = lm->CreateSequence();
    Prefill(*lm, seq, prompt);
    ForwardOk(*lm, {{seq, 10, tokens, parents, 0}});
    const std::vector<int> path = {0, 2, 4, 7, 10, 13};  // moves every slot but the first
    lm->Commit(seq, 10, path);
    const int L = 10 + static_cast<int>(path.size());
    EXPECT_EQ(lm->kv_cache().num_reserved_slots(seq), 16);  // 16 slots = 1 page

    // Continue with a small tree of two more tokens after the committed path.
    const std::vector<int32_t> next = RandomTokens(rng, 3, V);
    const std::vector<float> cont = ForwardOk(*lm, {{seq, L, next, {-1, 0, 0}, 0}});

    std::vector<int32_t> direct = prompt;
    for (int j : path) direct.push_back(tokens[j]);
    const SeqId fresh = lm->CreateSequence();
    const std::vector<float> a = Prefill(*lm, fresh, direct);
    const std::vector<float> b = ForwardOk(*lm, {{fresh, L, next, {-1, 0, 0}, 0}});
    EXPECT_TRUE(BitEqual(cont, b)) << c.architecture;
  }
}

TEST(CpuCausalLmTest, IncrementalTreeEqualsOneShotTreeBitwise) {
  const ModelConfig c = SmallLlamaConfig();
  const int V = c.vocab_size;
  std::mt19937 rng(4);
  const std::vector<int32_t> prompt = RandomTokens(rng, 7, V);
  const std::vector<int32_t> tokens = RandomTokens(rng, 12, V);
  const std::vector<int32_t> parents = RandomTreeParents(rng, 12);
  auto lm = MakeLm(c);
  const SeqId a = lm->CreateSequence(), b = lm->CreateSequence();
  Prefill(*lm, a, prompt);
  Prefill(*lm, b, prompt);
  const std::vector<float> once = ForwardOk(*lm, {{a, 7, tokens, parents, 0}});
  // Depth by depth, as a drafter grows its tree: nodes [0, 5), then [5, 12).
  std::vector<int32_t> t5(tokens.begin(), tokens.begin() + 5),
      p5(parents.begin(), parents.begin() + 5);
  const std::vector<float> first = ForwardOk(*lm, {{b, 7, t5, p5, 0}});
  const std::vector<float> second = ForwardOk(*lm, {{b, 7, tokens, parents, 5}});
  ASSERT_EQ(second.size(), 7u * V);
  std::vector<float> both = first;
  both.insert(both.end(), second.begin(), second.end());
  EXPECT_TRUE(BitEqual(both, once));
}

TEST(CpuCausalLmTest, BatchEqualsEachSequenceAloneBitwise) {
  for (int tp : {1, 3}) {
    for (const ModelConfig& c : {Qwen2Config(), SmallDeepseekConfig()}) {
      const int V = c.vocab_size;
      std::mt19937 rng(5);
      const std::vector<int32_t> p1 = RandomTokens(rng, 17, V), p2 = RandomTokens(rng, 5, V);
      const std::vector<int32_t> chain = RandomTokens(rng, 30, V);
      const std::vector<int32_t> tree = RandomTokens(rng, 9, V);
      const std::vector<int32_t> tree_parents = RandomTreeParents(rng, 9);
      const std::vector<int32_t> one = RandomTokens(rng, 1, V);

      auto batched = MakeLm(c, tp), single = MakeLm(c, tp);
      std::vector<SeqId> sb, ss;
      for (CausalLm* lm : {batched.get(), single.get()}) {
        auto& ids = lm == batched.get() ? sb : ss;
        for (int i = 0; i < 3; ++i) ids.push_back(lm->CreateSequence());
        Prefill(*lm, ids[1], p1);
        Prefill(*lm, ids[2], p2);
      }
      const std::vector<float> all = ForwardOk(*batched, {{sb[0], 0, chain, ChainParents(30), 0},
                                                          {sb[1], 17, tree, tree_parents, 0},
                                                          {sb[2], 5, one, {-1}, 0}});
      std::vector<float> alone = ForwardOk(*single, {{ss[0], 0, chain, ChainParents(30), 0}});
      for (const auto& part : {ForwardOk(*single, {{ss[1], 17, tree, tree_parents, 0}}),
                               ForwardOk(*single, {{ss[2], 5, one, {-1}, 0}})}) {
        alone.insert(alone.end(), part.begin(), part.end());
      }
      EXPECT_TRUE(BitEqual(all, alone)) << c.architecture << " tp " << tp;
    }
  }
}

// A prompt whose first pages were cached by an earlier sequence (the prefix cache) gives the
// same logits, bit for bit, as the whole prompt computed cold: the cached pages hold exactly the
// K/V a cold prefill writes there (MLA's latent entries likewise).
TEST(CpuCausalLmTest, CachedPrefixEqualsColdPrefillBitwise) {
  for (const ModelConfig& c : {SmallLlamaConfig(), SmallDeepseekConfig()}) {
    std::mt19937 rng(9);
    const int V = c.vocab_size;
    const std::vector<int32_t> first = RandomTokens(rng, 45, V);  // 2 full pages of 16 + 13
    std::vector<int32_t> second(first.begin(), first.begin() + 37);
    for (int32_t t : RandomTokens(rng, 11, V)) second.push_back(t);
    auto lm = MakeLm(c);
    const SeqId a = lm->CreateSequence();
    Prefill(*lm, a, first);
    lm->kv_cache().CachePages(a, first);
    lm->FreeSequence(a);

    const SeqId b = lm->CreateSequence();
    const int cached = lm->kv_cache().AttachCachedPrefix(b, second);
    ASSERT_EQ(cached, 32) << c.architecture;
    const std::vector<int32_t> rest(second.begin() + cached, second.end());
    const std::vector<float> warm = Prefill(*lm, b, rest, cached);
    const std::vector<float> cold = Prefill(*lm, lm->CreateSequence(), second);
    for (size_t i = 0; i < rest.size(); ++i) {
      ASSERT_TRUE(BitEqual(Row(warm, i, V), Row(cold, cached + i, V)))
          << c.architecture << " position " << cached + i;
    }
  }
}

TEST(CpuCausalLmTest, TruncateThenRedecodeEqualsFresh) {
  const ModelConfig c = SmallLlamaConfig();
  std::mt19937 rng(6);
  const std::vector<int32_t> tokens = RandomTokens(rng, 40, c.vocab_size);
  const std::vector<int32_t> other = RandomTokens(rng, 20, c.vocab_size);
  auto lm = MakeLm(c);
  const SeqId seq = lm->CreateSequence();
  Prefill(*lm, seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + 20));
  Prefill(*lm, seq, other, 20);  // later rolled back
  lm->Truncate(seq, 20);
  EXPECT_EQ(lm->kv_cache().num_reserved_slots(seq), 32);
  const std::vector<float> redo =
      Prefill(*lm, seq, std::vector<int32_t>(tokens.begin() + 20, tokens.end()), 20);
  const std::vector<float> fresh = Prefill(*lm, lm->CreateSequence(), tokens);
  EXPECT_TRUE(BitEqual(redo, std::vector<float>(fresh.begin() + 20 * c.vocab_size, fresh.end())));
}

// ---------------------------------------------------------------------------------------------
// Tensor parallelism: uneven splits, straddling GQA groups, ranks without MLP columns.

// TP changes the order of the row-parallel sums (o_proj, down_proj) only: per layer two extra
// roundings of the residual update, O(u · |update|), propagated through a few layers.
// Observed ≈ 1e-6 of max|logit|; 2e-5 leaves a 10× margin and is still 100× below a real bug.
constexpr double kTpRel = 2e-5;

struct TpCase {
  const char* name;
  ModelConfig config;
  int tp;
};

TEST(CpuCausalLmTest, TensorParallelMatchesSingleRank) {
  ModelConfig narrow = SmallLlamaConfig();  // 8 q / 4 kv heads, MLP 320 = 5 units of 64
  ModelConfig qwen2_uneven = UnevenConfig();
  qwen2_uneven.qkv_bias = true;
  qwen2_uneven.tie_word_embeddings = false;
  const TpCase cases[] = {{"uneven", UnevenConfig(), 2},
                          {"uneven", UnevenConfig(), 3},
                          {"uneven", UnevenConfig(), 7},
                          {"narrow", narrow, 3},
                          {"narrow", narrow, 7},
                          {"qwen2", qwen2_uneven, 3},
                          {"qwen3", Qwen3Config(), 2},
                          {"deepseek", SmallDeepseekConfig(), 2},
                          {"deepseek", SmallDeepseekConfig(), 3},
                          {"deepseek", SmallDeepseekConfig(), 7},
                          {"deepseek-direct-q", DeepseekDirectQConfig(), 3}};
  for (const TpCase& tc : cases) {
    const ModelConfig& c = tc.config;
    const int V = c.vocab_size;
    std::mt19937 rng(7);
    const std::vector<int32_t> prompt = RandomTokens(rng, 24, V);
    const std::vector<int32_t> tree = RandomTokens(rng, 12, V);
    const std::vector<int32_t> parents = RandomTreeParents(rng, 12);
    auto ref = MakeLm(c, 1), lm = MakeLm(c, tc.tp);
    ASSERT_EQ(lm->tensor_parallel(), tc.tp);
    std::vector<float> want, got;
    std::vector<int32_t> want_tokens, got_tokens;
    for (CausalLm* m : {ref.get(), lm.get()}) {
      std::vector<float>& logits = m == ref.get() ? want : got;
      std::vector<int32_t>& greedy = m == ref.get() ? want_tokens : got_tokens;
      const SeqId seq = m->CreateSequence(), seq2 = m->CreateSequence();
      logits = Prefill(*m, seq, prompt);
      const std::vector<float> t = ForwardOk(*m, {{seq, 24, tree, parents, 0}});
      logits.insert(logits.end(), t.begin(), t.end());
      // Greedy decoding, 12 steps, one token at a time.
      Prefill(*m, seq2, prompt);
      int32_t next = Argmax(Row(logits, 23, V));
      for (int step = 0; step < 12; ++step) {
        greedy.push_back(next);
        next = Argmax(Prefill(*m, seq2, {next}, 24 + step));
      }
    }
    double worst = 0;
    for (int r = 0; r < 36; ++r) worst = std::max(worst, RelDiff(Row(got, r, V), Row(want, r, V)));
    std::printf("tp %d %s: max rel diff %.3g\n", tc.tp, tc.name, worst);
    EXPECT_LT(worst, kTpRel) << tc.name << " tp " << tc.tp;
    EXPECT_EQ(got_tokens, want_tokens) << tc.name << " tp " << tc.tp;
  }
}

TEST(CpuCausalLmTest, TensorParallelIsDeterministicAcrossRuns) {
  const ModelConfig c = UnevenConfig();
  std::mt19937 rng(8);
  const std::vector<int32_t> tokens = RandomTokens(rng, 20, c.vocab_size);
  auto a = MakeLm(c, 7), b = MakeLm(c, 7);
  EXPECT_TRUE(
      BitEqual(Prefill(*a, a->CreateSequence(), tokens), Prefill(*b, b->CreateSequence(), tokens)));
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(CpuCausalLmTest, BadBatchesAreInvalidArgumentAndChangeNothing) {
  const ModelConfig c = SmallLlamaConfig();
  for (int tp : {1, 2}) {
    auto lm = MakeLm(c, tp);
    const SeqId seq = lm->CreateSequence(), other = lm->CreateSequence();
    std::mt19937 rng(9);
    const std::vector<int32_t> prompt = RandomTokens(rng, 20, c.vocab_size);
    Prefill(*lm, seq, prompt);
    const int free_before = lm->kv_cache().free_pages();
    const int reserved_before = lm->kv_cache().num_reserved_slots(seq);
    const std::vector<std::vector<SeqTree>> bad = {
        {{seq, 20, {1, c.vocab_size}, {-1, 0}, 0}},          // token out of range
        {{seq, 20, {1, -3}, {-1, 0}, 0}},                    // negative token
        {{seq, 20, {1, 2}, {-1, 1}, 0}},                     // parent not before the node
        {{seq, 20, {1, 2}, {-1, -2}, 0}},                    // parent below -1
        {{seq, 20, {1, 2}, {-1}, 0}},                        // sizes disagree
        {{seq, 20, {}, {}, 0}},                              // empty tree
        {{seq, 20, {1, 2}, {-1, 0}, 3}},                     // first_new > n
        {{seq, 20, {1, 2}, {-1, 0}, -1}},                    // first_new < 0
        {{seq, 40, {1}, {-1}, 0}},                           // L beyond the reserved slots
        {{seq, -1, {1}, {-1}, 0}},                           // negative L
        {{seq, 30, {1, 2, 3}, {-1, 0, 1}, 3}},               // old nodes never computed
        {{seq + 100, 0, {1}, {-1}, 0}},                      // unknown sequence
        {{seq, 20, {1}, {-1}, 0}, {seq, 20, {2}, {-1}, 0}},  // duplicate sequence
        {{seq, 20, std::vector<int32_t>(240, 1), ChainParents(240), 0}},  // past context 256
        {{seq, 20, {1, 2, 3, 4, 5, 6, 7}, ChainParents(7), 0},
         {other, 0, {1}, {0}, 0}},  // the second entry is bad
    };
    for (size_t i = 0; i < bad.size(); ++i) {
      auto out = lm->Forward(bad[i]);
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
          << "case " << i << ": " << out.status();
      EXPECT_EQ(lm->kv_cache().free_pages(), free_before) << "case " << i;
      EXPECT_EQ(lm->kv_cache().num_reserved_slots(seq), reserved_before) << "case " << i;
    }
    // Still works, and gives what an untouched model gives.
    auto fresh = MakeLm(c, tp);
    const SeqId f = fresh->CreateSequence();
    Prefill(*fresh, f, prompt);
    EXPECT_TRUE(BitEqual(Prefill(*lm, seq, {5, 6}, 20), Prefill(*fresh, f, {5, 6}, 20)));
  }
}

TEST(CpuCausalLmTest, OutOfPagesIsResourceExhaustedAllOrNothing) {
  const ModelConfig c = SmallLlamaConfig();
  auto lm = MakeLm(c, /*tp=*/1, /*kv_pages=*/4);
  std::mt19937 rng(10);
  const std::vector<int32_t> t40 = RandomTokens(rng, 40, c.vocab_size);
  const std::vector<int32_t> t10 = RandomTokens(rng, 10, c.vocab_size);
  const std::vector<int32_t> t20 = RandomTokens(rng, 20, c.vocab_size);
  const SeqId a = lm->CreateSequence(), b = lm->CreateSequence(), d = lm->CreateSequence();
  Prefill(*lm, a, t40);  // 3 of 4 pages
  EXPECT_EQ(lm->kv_cache().free_pages(), 1);
  auto out = lm->Forward({{b, 0, t10, ChainParents(10), 0}, {d, 0, t20, ChainParents(20), 0}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_EQ(lm->kv_cache().free_pages(), 1);  // b's page was given back
  EXPECT_EQ(lm->kv_cache().num_reserved_slots(b), 0);
  // The cache still works: b alone fits, and a's K/V is intact.
  auto ref = MakeLm(c);
  const SeqId rb = ref->CreateSequence(), ra = ref->CreateSequence();
  EXPECT_TRUE(BitEqual(Prefill(*lm, b, t10), Prefill(*ref, rb, t10)));
  Prefill(*ref, ra, t40);
  lm->FreeSequence(b);
  ref->FreeSequence(rb);
  EXPECT_TRUE(BitEqual(Prefill(*lm, a, {7}, 40), Prefill(*ref, ra, {7}, 40)));
}

TEST(CpuCausalLmTest, CreateRejectsBadOptionsAndWeights) {
  const ModelConfig c = SmallLlamaConfig();
  LmOptions o;
  o.kv_pages = 8;
  o.tensor_parallel = 0;
  EXPECT_EQ(CreateCpuCausalLm(c, RandomWeights(c, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.tensor_parallel = 9;  // > 8 q heads
  EXPECT_EQ(CreateCpuCausalLm(c, RandomWeights(c, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.tensor_parallel = 1;
  o.kv_page_size = 0;
  EXPECT_EQ(CreateCpuCausalLm(c, RandomWeights(c, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.kv_page_size = 16;
  ModelWeights w = RandomWeights(c, 1);
  w.layers[0].mlp.w_up = Tensor({3, 4});
  auto bad = CreateCpuCausalLm(c, std::move(w), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("up_proj"), std::string::npos) << bad.status();
}

TEST(CpuCausalLmTest, DefaultKvPoolCoversMaxBatchAtFullContext) {
  const ModelConfig c = SmallLlamaConfig();  // context 256
  LmOptions o;
  o.max_batch = 3;
  o.kv_page_size = 16;
  auto lm = CreateCpuCausalLm(c, RandomWeights(c, 1), o);
  ASSERT_TRUE(lm.ok());
  EXPECT_EQ((*lm)->kv_cache().num_pages(), 3 * 16);
  EXPECT_EQ((*lm)->device(), "cpu");
}

}  // namespace
}  // namespace treespec
