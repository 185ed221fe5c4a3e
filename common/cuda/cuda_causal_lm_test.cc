// The CUDA CausalLm against the CPU reference (DESIGN §8): the same weights in both, the same
// batches (a prefill chain, then a random tree after it), logits compared row by row; chunked
// forwards equal whole ones; Commit moves the accepted K/V like CommitPath; tensor parallelism
// over two GPUs where the machine has them. Models: the
// embedded tiny pair (models/), a random Qwen2-style model (q/k/v bias, untied head, d 64)
// and a random Qwen3-style one (q/k norm, d 128). Skips without a GPU.
//
// Tolerance: the GPU runs bf16 weights and activations (rounded after every op) against fp32
// on the CPU, so rows agree to bf16-level error: |gpu - cpu| <= 4 % of the row's largest
// |logit| (measured worst is printed), and the argmax agrees wherever the CPU's top-2 margin
// exceeds twice the worst error seen (near-ties are counted and reported, DESIGN §3).
#include "common/cuda/cuda_causal_lm.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/model/dflash_config.h"
#include "common/model/dflash_weights.h"
#include "common/model/dtype.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {

bool HaveGpu() { return CudaDeviceAvailable(); }
#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: GPU test skipped; run it on the GPU machine"

struct Pair {
  std::unique_ptr<CausalLm> cpu, gpu;
};

// `make_weights` gives the same weights on every call (one copy per backend).
using WeightsFn = std::function<ModelWeights()>;

// The GPU model tensor-parallel over GPUs 0..tp-1.
Pair Build(const ModelConfig& config, const WeightsFn& make_weights, int max_rows = 2048,
           int tp = 1, bool peer = true, const GemmOptions& gemm = {}) {
  LmOptions options;
  options.max_batch = 4;
  Pair p;
  auto cpu = CreateCpuCausalLm(config, make_weights(), options);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  CudaLmOptions cuda;
  cuda.max_rows = max_rows;
  cuda.peer_all_reduce = peer;
  cuda.gemm = gemm;
  options.tensor_parallel = tp;
  auto gpu = CreateCudaCausalLm(config, make_weights(), options, cuda);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (cpu.ok()) p.cpu = *std::move(cpu);
  if (gpu.ok()) p.gpu = *std::move(gpu);
  return p;
}

WeightsFn Random(const ModelConfig& config, uint64_t seed) {
  return [config, seed] { return testing::RandomWeights(config, seed); };
}

using testing::Chain;
using testing::RandomTree;

struct Comparison {
  double worst_rel = 0;  // max over rows of max|gpu - cpu| / max|cpu|
  int worst_row = -1;    // where (counting the rows of every Compare call)
  int rows = 0, argmax_differs = 0, near_ties = 0;
  int close_rows = 0;  // rows whose CPU top-2 margin is within the tie margin
};

// Compares [rows, vocab] logits; argmax differences at a CPU top-2 margin above `tie_margin`
// (relative to the row's scale) are failures, below it near-ties. A near-tie needs a close
// race, so CheckModel allows at most half of the close rows (or 5 % of all rows) to flip.
void Compare(const std::vector<float>& cpu, const std::vector<float>& gpu, int vocab,
             double tie_margin, Comparison& c) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t r = 0; r * vocab < cpu.size(); ++r) {
    const float* a = cpu.data() + r * vocab;
    const float* b = gpu.data() + r * vocab;
    double scale = 0, err = 0;
    int arg_a = 0, arg_b = 0;
    for (int v = 0; v < vocab; ++v) {
      ASSERT_TRUE(std::isfinite(b[v])) << "row " << r << " logit " << v << " is " << b[v];
      scale = std::max(scale, std::fabs(static_cast<double>(a[v])));
      err = std::max(err, std::fabs(static_cast<double>(a[v]) - b[v]));
      if (a[v] > a[arg_a]) arg_a = v;
      if (b[v] > b[arg_b]) arg_b = v;
    }
    float second = -std::numeric_limits<float>::infinity();
    for (int v = 0; v < vocab; ++v) {
      if (v != arg_a) second = std::max(second, a[v]);
    }
    if ((a[arg_a] - second) / scale <= tie_margin) ++c.close_rows;
    if (err / scale > c.worst_rel) {
      c.worst_rel = err / scale;
      c.worst_row = c.rows;
    }
    ++c.rows;
    if (arg_a != arg_b) {
      ++c.argmax_differs;
      const double margin = (a[arg_a] - a[arg_b]) / scale;
      if (margin <= tie_margin) {
        ++c.near_ties;
      } else {
        ADD_FAILURE() << "row " << r << ": argmax " << arg_b << " on the GPU, " << arg_a
                      << " on the CPU, with a CPU margin of " << margin << " of the row's scale";
      }
    }
  }
}

// Prefill of a chain, then a tree after it, on both backends; then a commit of a path with gaps
// and one decode step after it.
void CheckModel(const std::string& name, const ModelConfig& config, const WeightsFn& weights,
                int max_rows = 2048, int tp = 1, bool peer = true, const GemmOptions& gemm = {}) {
  SCOPED_TRACE(name);
  Pair p = Build(config, weights, max_rows, tp, peer, gemm);
  if (p.gpu) EXPECT_EQ(p.gpu->tensor_parallel(), tp);
  ASSERT_TRUE(p.cpu && p.gpu);
  std::mt19937 rng(11);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(static_cast<int32_t>(rng() % config.vocab_size));
  const SeqId sc = p.cpu->CreateSequence(), sg = p.gpu->CreateSequence();
  Comparison c;
  constexpr double kTieMargin = 0.08;  // twice the 4 % bound
  {
    auto a = p.cpu->Forward({Chain(sc, 0, prompt)});
    auto b = p.gpu->Forward({Chain(sg, 0, prompt)});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    Compare(*a, *b, config.vocab_size, kTieMargin, c);
  }
  std::mt19937 tree_rng(5);
  SeqTree tree = RandomTree(sc, 37, 17, config.vocab_size, tree_rng);
  {
    auto a = p.cpu->Forward({tree});
    tree.seq = sg;
    auto b = p.gpu->Forward({tree});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    Compare(*a, *b, config.vocab_size, kTieMargin, c);
  }
  // Accept a root-to-leaf path of the tree (gaps in slot order), then decode one token.
  std::vector<int> path = {16};
  while (path.back() != 0) path.push_back(tree.parents[path.back()]);
  std::reverse(path.begin(), path.end());
  p.cpu->Commit(sc, 37, path);
  p.gpu->Commit(sg, 37, path);
  const int committed = 37 + static_cast<int>(path.size());
  EXPECT_EQ(p.gpu->kv_cache().num_reserved_slots(sg) >= committed, true);
  {
    auto a = p.cpu->Forward({Chain(sc, committed, {3})});
    auto b = p.gpu->Forward({Chain(sg, committed, {3})});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    Compare(*a, *b, config.vocab_size, kTieMargin, c);
  }
  std::cerr << name << ": " << c.rows << " rows, worst |gpu - cpu| " << c.worst_rel
            << " of the row scale (row " << c.worst_row << "), argmax differs in "
            << c.argmax_differs << " (near-ties " << c.near_ties << " of " << c.close_rows
            << " close rows)\n";
  EXPECT_LE(c.worst_rel, 0.04);
  EXPECT_LE(c.near_ties, std::max(c.rows / 20, c.close_rows / 2))
      << "too many near-ties to be ties";
}

TEST(CudaCausalLmTest, TinyPairMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string dir : {"models/tiny-target", "models/tiny-draft"}) {
    const std::string path = absl::StrCat(TREESPEC_SOURCE_DIR, "/", dir);
    auto config = LoadModelConfig(path);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(LoadModelWeights(path, *config).ok());
    CheckModel(dir, *config, [&] { return *LoadModelWeights(path, *config); });
  }
}

TEST(CudaCausalLmTest, RandomQwenStyleModelsMatchCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig qwen2 = testing::SmallLlamaConfig();
  qwen2.architecture = "Qwen2ForCausalLM";
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = false;
  qwen2.hidden_size = 256;
  qwen2.num_q_heads = 4;
  qwen2.num_kv_heads = 2;
  qwen2.head_dim = 64;
  qwen2.vocab_size = 1000;
  CheckModel("qwen2-style", qwen2, Random(qwen2, 3));
  // The same through each GEMM path: cuBLASLt for every GEMM, and the few-row kernel launched
  // plainly rather than as a programmatic dependent.
  CheckModel("qwen2-style, cuBLASLt GEMMs", qwen2, Random(qwen2, 3), 2048, 1, true,
             {.skinny_max_rows = 0});
  CheckModel("qwen2-style, plain launches", qwen2, Random(qwen2, 3), 2048, 1, true,
             {.dependent_launch = false});

  ModelConfig qwen3 = qwen2;
  qwen3.architecture = "Qwen3ForCausalLM";
  qwen3.qkv_bias = false;
  qwen3.qk_norm = true;
  qwen3.head_dim = 128;  // head_dim set apart from hidden / heads, as Qwen3 does
  qwen3.num_q_heads = 4;
  qwen3.num_kv_heads = 1;
  CheckModel("qwen3-style", qwen3, Random(qwen3, 4));
}

TEST(CudaCausalLmTest, ChunkedForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  // 5 rows per chunk: the 37-token prefill runs as 8 chunks, the 17-node tree as 4, each
  // chunk attending to the K/V the earlier ones wrote.
  ModelConfig config = testing::TinyTargetConfig();
  CheckModel("tiny-shaped, 5-row chunks", config, Random(config, 9), 5);
}

// The device verify step (choice, walk and commit on the GPU) against the host path of the
// same model (CausalLm::VerifyStep: Forward, ChooseToken, WalkTree, Commit): identical logits
// on both sides, so identical paths and tokens, step after step, for a batch mixing prefills
// and trees, greedy and sampled requests. A wrong commit shows up in the later steps.
// Sequence 1 samples on odd steps only, so even steps are all greedy (under tp > 1 the ranks
// then exchange (max, id) pairs instead of logits) and odd steps mix greedy and sampled rows,
// starting with sequence 1's sampled prefill at step 1. With `max_rows` small that prefill runs
// in several chunks, the ones before its last row choosing by (max, id) exchange alone (their
// choices are never read).
void CheckDeviceVerifyStep(int tp, int max_rows = 2048) {
  ModelConfig config = testing::TinyTargetConfig();
  config.vocab_size = 16;  // tiny, so random trees are often accepted several nodes deep
  LmOptions options;
  options.max_batch = 4;
  options.tensor_parallel = tp;
  CudaLmOptions cuda;
  cuda.max_rows = max_rows;
  auto device_lm = CreateCudaCausalLm(config, testing::RandomWeights(config, 21), options, cuda);
  auto host_lm = CreateCudaCausalLm(config, testing::RandomWeights(config, 21), options, cuda);
  ASSERT_TRUE(device_lm.ok() && host_lm.ok());
  CausalLm& dev = **device_lm;
  CausalLm& host = **host_lm;
  // Sequences 0 and 1 capture target features; the paths must keep the same rows.
  ASSERT_TRUE(dev.SetFeatureLayers({0, 3, 5}).ok());
  ASSERT_TRUE(host.SetFeatureLayers({0, 3, 5}).ok());
  constexpr int kSeqs = 3;
  std::vector<SeqId> ds, hs;
  std::vector<int> committed(kSeqs, 0);
  std::vector<int32_t> bonus(kSeqs, 0);
  std::vector<StepSpec> specs(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    ds.push_back(dev.CreateSequence());
    hs.push_back(host.CreateSequence());
    specs[i].sampling.temperature = i == 1 ? 0.9f : 0.0f;
    specs[i].sampling.top_p = 0.95f;
    specs[i].sampling.seed = 77 + i;
    specs[i].capture_features = i < 2;
  }
  std::mt19937 rng(3);
  int accepted_deep = 0;
  for (int step = 0; step < 12; ++step) {
    std::vector<SeqTree> dbatch, hbatch;
    for (int i = 0; i < kSeqs; ++i) {
      SeqTree t;
      // Sequence i joins at step i with its prompt (prefill mixed with the others' trees).
      if (step < i) continue;
      specs[i].prefill = step == i;
      if (specs[i].prefill) {
        std::vector<int32_t> prompt;
        for (int k = 0; k < 20 + 7 * i; ++k) prompt.push_back(static_cast<int32_t>(rng() % 16));
        t = Chain(0, 0, prompt);
      } else {
        t = RandomTree(0, committed[i], 1 + static_cast<int>(rng() % 20), 16, rng);
        t.tokens[0] = bonus[i];
      }
      t.seq = ds[i];
      dbatch.push_back(t);
      t.seq = hs[i];
      hbatch.push_back(t);
    }
    specs[1].sampling.temperature = step % 2 == 1 ? 0.9f : 0.0f;
    std::vector<StepSpec> step_specs;
    for (int i = 0; i < kSeqs; ++i) {
      if (step >= i) step_specs.push_back(specs[i]);
    }
    auto a = dev.VerifyStep(dbatch, step_specs);
    auto b = host.CausalLm::VerifyStep(hbatch, step_specs);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    ASSERT_EQ(a->size(), b->size());
    int e = 0;
    for (int i = 0; i < kSeqs; ++i) {
      if (step < i) continue;
      SCOPED_TRACE(absl::StrCat("step ", step, " sequence ", i));
      EXPECT_EQ((*a)[e].path, (*b)[e].path);
      EXPECT_EQ((*a)[e].emitted, (*b)[e].emitted);
      EXPECT_EQ(static_cast<size_t>((*a)[e].features.rows),
                specs[i].capture_features ? (*a)[e].path.size() : 0u);
      EXPECT_EQ((*a)[e].features.width, specs[i].capture_features ? 3 * config.hidden_size : 0);
      EXPECT_EQ((*a)[e].features.bf16, (*b)[e].features.bf16);
      accepted_deep += (*a)[e].path.size() > 1 ? 1 : 0;
      committed[i] += static_cast<int>((*b)[e].path.size());
      if (specs[i].prefill) committed[i] = static_cast<int>(dbatch[e].tokens.size());
      bonus[i] = (*b)[e].emitted.back();
      EXPECT_EQ(dev.kv_cache().num_reserved_slots(ds[i]),
                host.kv_cache().num_reserved_slots(hs[i]));
      ++e;
    }
  }
  std::cerr << "steps that accepted a drafted node: " << accepted_deep << "\n";
  EXPECT_GT(accepted_deep, 5) << "the commit of accepted nodes was hardly exercised";
}

TEST(CudaCausalLmTest, DeviceVerifyStepEqualsHostPath) {
  SKIP_WITHOUT_GPU();
  CheckDeviceVerifyStep(1);
  CheckDeviceVerifyStep(1, /*max_rows=*/8);  // chunked: prefills and trees over several forwards
}

// Tensor parallelism over two GPUs (NCCL): logits against the CPU for the tiny target and for
// a model whose split is uneven everywhere (6 q heads over 3 KV heads, so a GQA group straddles
// the ranks and its KV head lives on both; 5 MLP units of 64 split 2 + 3; an odd vocabulary;
// q/k/v bias and an untied head) with both all-reduce paths (peer access, NCCL), and the
// device verify step (both choice paths, walk and commit on every rank) against the host path.
// Target features on the GPU (bf16, from the verify step itself) against the CPU's (fp32, then
// rounded): the rows a speculative run keeps on the GPU against one CPU prefill of the tokens
// the GPU committed, within bf16-level error of each row's scale. The layers include the last,
// whose output is the residual stream before the final norm.
TEST(CudaCausalLmTest, CapturedFeaturesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = testing::TinyTargetConfig();
  Pair p = Build(config, Random(config, 41));
  ASSERT_TRUE(p.cpu && p.gpu);
  const std::vector<int> layers = {1, 3, 5};
  ASSERT_TRUE(p.gpu->SetFeatureLayers(layers).ok());
  ASSERT_TRUE(p.cpu->SetFeatureLayers(layers).ok());
  std::mt19937 rng(8);
  std::vector<int32_t> committed;
  for (int k = 0; k < 37; ++k) committed.push_back(static_cast<int32_t>(rng() % config.vocab_size));
  const SeqId seq = p.gpu->CreateSequence();
  StepSpec spec;
  spec.prefill = true;
  spec.capture_features = true;
  auto first = p.gpu->VerifyStep({Chain(seq, 0, committed)}, {spec});
  ASSERT_TRUE(first.ok()) << first.status();
  TargetFeatures gpu_rows = (*first)[0].features;
  int32_t bonus = (*first)[0].emitted.back();
  spec.prefill = false;
  for (int step = 0; step < 10; ++step) {
    SeqTree t = RandomTree(seq, static_cast<int>(committed.size()), 1 + step * 7 % 23,
                           config.vocab_size, rng);
    t.tokens[0] = bonus;
    auto r = p.gpu->VerifyStep({t}, {spec});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(static_cast<size_t>((*r)[0].features.rows), (*r)[0].path.size());
    for (int node : (*r)[0].path) committed.push_back(t.tokens[node]);
    gpu_rows.Append((*r)[0].features);
    bonus = (*r)[0].emitted.back();
  }
  auto cpu =
      p.cpu->VerifyStep({Chain(p.cpu->CreateSequence(), 0, committed)},
                        {StepSpec{SamplingConfig{}, /*prefill=*/true, /*capture_features=*/true}});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const TargetFeatures& cpu_rows = (*cpu)[0].features;
  ASSERT_EQ(gpu_rows.rows, cpu_rows.rows);
  ASSERT_EQ(gpu_rows.width, cpu_rows.width);
  const double worst = testing::WorstFeatureError(gpu_rows, cpu_rows, config.hidden_size);
  EXPECT_LT(worst, 0.05);
  std::cerr << "captured features: " << cpu_rows.rows << " rows, worst error " << worst
            << " of the row's scale\n";
}

TEST(CudaCausalLmTest, TensorParallelTwoGpus) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "fewer than 2 GPUs: TP=2 test skipped";
  const std::string dir = absl::StrCat(TREESPEC_SOURCE_DIR, "/models/tiny-target");
  auto tiny = LoadModelConfig(dir);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  CheckModel(
      "tiny-target tp=2", *tiny, [&] { return *LoadModelWeights(dir, *tiny); }, 2048, 2);

  ModelConfig uneven = testing::SmallLlamaConfig();
  uneven.architecture = "Qwen2ForCausalLM";
  uneven.qkv_bias = true;
  uneven.tie_word_embeddings = false;
  uneven.num_q_heads = 6;
  uneven.num_kv_heads = 3;
  uneven.head_dim = 64;
  uneven.hidden_size = 384;
  uneven.intermediate_size = 320;
  uneven.vocab_size = 1001;
  CheckModel("uneven qwen2-style tp=2", uneven, Random(uneven, 8), 2048, 2);
  CheckModel("uneven qwen2-style tp=2, 5-row chunks", uneven, Random(uneven, 8), 5, 2);
  // The NCCL all-reduce path (GPUs without peer access take it).
  CheckModel("uneven qwen2-style tp=2, NCCL all-reduces", uneven, Random(uneven, 8), 2048, 2,
             /*peer=*/false);
  CheckDeviceVerifyStep(2);
  CheckDeviceVerifyStep(2, /*max_rows=*/8);

  // TP=2 against TP=1 directly, same weights and batches: the uneven model's prefill of 200
  // tokens and a 33-node tree after it.
  LmOptions options;
  options.max_batch = 4;
  std::unique_ptr<CausalLm> lm[2];
  for (int tp : {1, 2}) {
    options.tensor_parallel = tp;
    auto made = CreateCudaCausalLm(uneven, testing::RandomWeights(uneven, 8), options);
    ASSERT_TRUE(made.ok()) << made.status();
    lm[tp - 1] = *std::move(made);
  }
  std::mt19937 rng(4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back(static_cast<int32_t>(rng() % uneven.vocab_size));
  const SeqTree tree = RandomTree(0, 200, 33, uneven.vocab_size, rng);
  Comparison c;
  std::vector<float> got[2];
  const SeqId seq[2] = {lm[0]->CreateSequence(), lm[1]->CreateSequence()};
  for (int step = 0; step < 2; ++step) {
    for (int t = 0; t < 2; ++t) {
      SeqTree batch = step == 0 ? Chain(seq[t], 0, prompt) : tree;
      batch.seq = seq[t];
      auto logits = lm[t]->Forward({batch});
      ASSERT_TRUE(logits.ok()) << logits.status();
      got[t] = std::move(*logits);
    }
    Compare(got[0], got[1], uneven.vocab_size, 0.08, c);
  }
  std::cerr << "tp=2 vs tp=1: " << c.rows << " rows, worst " << c.worst_rel
            << " of the row scale, argmax differs in " << c.argmax_differs << " (near-ties "
            << c.near_ties << ")\n";
  EXPECT_LE(c.worst_rel, 0.04);
  EXPECT_LE(c.near_ties, c.rows / 20) << "too many near-ties to be ties";
}

// CUDA graphs: the first forward of a row bucket runs eagerly and captures the bucket's graph;
// later forwards of the bucket replay it. Two sequences fed the same tokens, one through the
// eager run and one through the replay, get identical logits (same kernels, same padded rows),
// also after a longer context makes the attention need more CTAs than the graph was captured
// with (a recapture). Graphs on and off agree to bf16 level (the padded GEMMs may pick other
// algorithms).
TEST(CudaCausalLmTest, GraphReplayEqualsEagerRun) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = testing::TinyTargetConfig();
  LmOptions options;
  options.max_batch = 4;
  CudaLmOptions graphs, eager;
  eager.cuda_graphs = false;
  auto a = CreateCudaCausalLm(config, testing::RandomWeights(config, 5), options, graphs);
  auto b = CreateCudaCausalLm(config, testing::RandomWeights(config, 5), options, eager);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  CausalLm& lm = **a;
  std::mt19937 rng(2);
  for (const int context : {20, 1500}) {  // 1500: ~4x the attention CTAs of 20
    SCOPED_TRACE(absl::StrCat("context ", context));
    std::vector<int32_t> prompt;
    for (int i = 0; i < context; ++i) prompt.push_back(static_cast<int32_t>(rng() % 4096));
    const SeqTree tree = RandomTree(0, context, 11, 4096, rng);
    std::vector<std::vector<float>> got;
    for (int copy = 0; copy < 2; ++copy) {  // copy 0: eager + capture; copy 1: replay
      const SeqId seq = lm.CreateSequence();
      auto pre = lm.Forward({Chain(seq, 0, prompt)});
      ASSERT_TRUE(pre.ok()) << pre.status();
      SeqTree t = tree;
      t.seq = seq;
      auto logits = lm.Forward({t});
      ASSERT_TRUE(logits.ok()) << logits.status();
      got.push_back(std::move(*logits));
      lm.FreeSequence(seq);
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i) {
      ASSERT_EQ(got[0][i], got[1][i]) << "logit " << i << ": replay differs from the eager run";
    }
    // Against the eager-only model.
    const SeqId seq = (*b)->CreateSequence();
    ASSERT_TRUE((*b)->Forward({Chain(seq, 0, prompt)}).ok());
    SeqTree t = tree;
    t.seq = seq;
    auto want = (*b)->Forward({t});
    ASSERT_TRUE(want.ok()) << want.status();
    Comparison c;
    Compare(*want, got[1], config.vocab_size, 0.08, c);
    EXPECT_LE(c.worst_rel, 0.02) << "graph vs eager";
    (*b)->FreeSequence(seq);
  }
}

// The cuBLASLt plans tuned at load (the graph buckets of 33-64 rows) are the shapes forwards of
// those rows run: such forwards, eager and captured, build no plan of their own.
TEST(CudaCausalLmTest, ForwardsOfTunedBucketsBuildNoGemmPlan) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = testing::TinyTargetConfig();
  LmOptions options;
  options.max_batch = 4;
  auto made = CreateCudaCausalLm(config, testing::RandomWeights(config, 9), options);
  ASSERT_TRUE(made.ok()) << made.status();
  CausalLm& lm = **made;
  const int tuned = GemmPlanCount(lm);
  // Buckets 40, 48, 56 and 64 rows × QKV, o_proj, gate/up, down and the LM head.
  EXPECT_EQ(tuned, 4 * 5);
  std::mt19937 rng(4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back(static_cast<int32_t>(rng() % config.vocab_size));
  for (int copy = 0; copy < 2; ++copy) {  // copy 0: eager runs and captures; copy 1: replays
    for (const int nodes : {33, 64}) {
      const SeqId seq = lm.CreateSequence();
      auto pre = lm.Forward({Chain(seq, 0, prompt)});  // 45 rows: the 48-row bucket
      ASSERT_TRUE(pre.ok()) << pre.status();
      const SeqTree tree =
          RandomTree(seq, static_cast<int>(prompt.size()), nodes, config.vocab_size, rng);
      auto logits = lm.Forward({tree});
      ASSERT_TRUE(logits.ok()) << logits.status();
      lm.FreeSequence(seq);
    }
  }
  EXPECT_EQ(GemmPlanCount(lm), tuned) << "a forward of 33-64 rows built a GEMM plan at run time";
}

TEST(CudaCausalLmTest, RefusesMlaAndMoeLayersNamingTheLayer) {
  // Host-side check: runs without a GPU too.
  const ModelConfig deepseek = testing::SmallDeepseekConfig();
  absl::Status s = CudaSupportsLayers(deepseek);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("layer 0 has multi-head latent attention"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--device=cpu"), std::string::npos) << s;
  EXPECT_TRUE(CudaSupportsLayers(testing::TinyTargetConfig()).ok());
  SKIP_WITHOUT_GPU();
  auto lm = CreateCudaCausalLm(deepseek, testing::RandomWeights(deepseek, 1), LmOptions(),
                               CudaLmOptions());
  EXPECT_EQ(lm.status().code(), absl::StatusCode::kUnimplemented) << lm.status();
}

TEST(CudaCausalLmTest, BadBatchesAreRefusedLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = testing::TinyTargetConfig();
  Pair p = Build(config, Random(config, 1));
  ASSERT_TRUE(p.gpu);
  const SeqId s = p.gpu->CreateSequence();
  auto bad = p.gpu->Forward({Chain(s, 0, {1, 5000})});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("token id 5000"), std::string::npos) << bad.status();
  auto unknown = p.gpu->Forward({Chain(s + 100, 0, {1})});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  // The device verify step validates a tree before reading it: a parent that points past the
  // node is refused, not followed.
  SeqTree bad_tree = Chain(s, 0, {1, 2, 3});
  bad_tree.parents[1] = 7;
  auto refused_step = p.gpu->VerifyStep({bad_tree}, {StepSpec()});
  EXPECT_EQ(refused_step.status().code(), absl::StatusCode::kInvalidArgument)
      << refused_step.status();
  EXPECT_NE(refused_step.status().message().find("parent 7 of node 1"), std::string::npos)
      << refused_step.status();
  // The sequence still works afterwards.
  auto ok = p.gpu->Forward({Chain(s, 0, {1, 2, 3})});
  EXPECT_TRUE(ok.ok()) << ok.status();

  // One GPU per rank, as many GPUs as ranks.
  LmOptions tp2;
  tp2.tensor_parallel = 2;
  CudaLmOptions twice;
  twice.devices = {0, 0};
  auto refused = CreateCudaCausalLm(config, testing::RandomWeights(config, 1), tp2, twice);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("listed twice"), std::string::npos) << refused.status();
  CudaLmOptions one;
  one.devices = {0};
  auto short_list = CreateCudaCausalLm(config, testing::RandomWeights(config, 1), tp2, one);
  EXPECT_EQ(short_list.status().code(), absl::StatusCode::kInvalidArgument) << short_list.status();
}

// ForwardTopK ranks on the device what the host path (CausalLm::ForwardTopK: Forward, then
// LogSoftmax + TopKLogProbs) ranks from the same GPU logits: the same tokens, log-probs to float
// rounding; every new row or the last of each entry; chunks (max_rows 3) that cut entries and
// runs of wanted rows; k above the device limit falls back to the host path.
// A DFlash drafter's body (models/tiny-dflash on its target's embedding and head): context
// rows appended in chunks (AppendContext: fc, its norm, every layer's K/V; the GPU takes both
// sequences' rows in one call, the CPU each alone), then bidirectional blocks, two sequences' in
// one forward, on both backends. With max_rows 20 the 59-row append runs in chunks that end
// inside an entry and the second 16-node block cannot share the first's chunk (a block is never
// split). Same tolerance as the models above.
TEST(CudaCausalLmTest, DflashBlocksMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::string root = TREESPEC_SOURCE_DIR;
  absl::StatusOr<DflashConfig> dflash = LoadDflashConfig(root + "/models/tiny-dflash");
  ASSERT_TRUE(dflash.ok()) << dflash.status();
  DflashConfig config = *dflash;
  ASSERT_TRUE(LoadDflashWeights(root + "/models/tiny-dflash", config, root + "/models/tiny-target")
                  .ok());  // sets the body's tie_word_embeddings
  const ModelConfig& body = config.body;
  const WeightsFn weights = [config, root]() mutable {
    return *LoadDflashWeights(root + "/models/tiny-dflash", config, root + "/models/tiny-target");
  };
  const int width = body.context_width, vocab = body.vocab_size;
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  auto rows_of = [&](int n) {
    TargetFeatures f{n, width, {}};
    for (int i = 0; i < n * width; ++i) f.bf16.push_back(FloatToBf16Bits(normal(rng)));
    return f;
  };
  auto block = [&](SeqId seq, int context, int32_t bonus, int n) {
    return DflashBlock(config, seq, context, bonus, n);
  };
  for (int max_rows : {2048, 20}) {
    SCOPED_TRACE(::testing::Message() << "max_rows " << max_rows);
    Pair p = Build(body, weights, max_rows);
    ASSERT_TRUE(p.cpu && p.gpu);
    const SeqId c0 = p.cpu->CreateSequence(), c1 = p.cpu->CreateSequence();
    const SeqId g0 = p.gpu->CreateSequence(), g1 = p.gpu->CreateSequence();
    Comparison c;
    int context0 = 0, context1 = 0;
    for (const auto& [n0, n1] : {std::pair{50, 9}, std::pair{7, 1}, std::pair{3, 12}}) {
      const TargetFeatures r0 = rows_of(n0), r1 = rows_of(n1);
      ASSERT_TRUE(p.cpu->AppendContext(c0, context0, r0).ok());
      ASSERT_TRUE(p.cpu->AppendContext(c1, context1, r1).ok());
      // The GPU appends both in one call (with max_rows 20, chunks that end inside an entry).
      const std::vector<ContextRows> both = {{g0, context0, &r0}, {g1, context1, &r1}};
      absl::Status s = p.gpu->AppendContext(both);
      ASSERT_TRUE(s.ok()) << s;
      context0 += n0;
      context1 += n1;
      const int32_t bonus = static_cast<int32_t>(rng() % vocab);
      auto a = p.cpu->Forward({block(c0, context0, bonus, 16), block(c1, context1, bonus + 1, 8)});
      auto b = p.gpu->Forward({block(g0, context0, bonus, 16), block(g1, context1, bonus + 1, 8)});
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
      Compare(*a, *b, vocab, 0.08, c);
      // The device ranking of the same blocks: each depth's best token within a near-tie.
      auto top = p.gpu->ForwardTopK({block(g0, context0, bonus, 16)}, 4, TopKRows::kAllNew);
      ASSERT_TRUE(top.ok()) << top.status();
      ASSERT_EQ(top->size(), 16u);
      for (int r = 0; r < 16; ++r) {
        const float* row = a->data() + static_cast<size_t>(r) * vocab;
        const float best = *std::max_element(row, row + vocab);
        EXPECT_GE(row[(*top)[r][0].token], best - 0.08 * std::fabs(best) - 0.1) << "row " << r;
      }
      for (CausalLm* lm : {p.cpu.get(), p.gpu.get()}) {
        lm->Truncate(lm == p.cpu.get() ? c0 : g0, context0);
        lm->Truncate(lm == p.cpu.get() ? c1 : g1, context1);
      }
    }
    std::cerr << "DFlash blocks (max_rows " << max_rows << "): " << c.rows
              << " rows, worst |gpu - cpu| " << c.worst_rel
              << " of the row scale, argmax differs in " << c.argmax_differs << " (near-ties "
              << c.near_ties << ")\n";
    EXPECT_LE(c.worst_rel, 0.04);
    EXPECT_LE(c.near_ties, std::max(c.rows / 20, c.close_rows / 2));
    // A block longer than a chunk is refused, not split.
    if (max_rows == 20) {
      EXPECT_EQ(p.gpu->Forward({block(g0, context0, 3, 21)}).status().code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(CudaCausalLmTest, DeviceTopKEqualsHostRanking) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = testing::TinyTargetConfig();
  config.num_layers = 2;
  for (int max_rows : {2048, 3}) {
    SCOPED_TRACE(::testing::Message() << "max_rows " << max_rows);
    Pair p = Build(config, Random(config, 21), max_rows);
    ASSERT_TRUE(p.gpu);
    CausalLm& gpu = *p.gpu;
    std::mt19937 rng(4);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back(static_cast<int32_t>(rng() % config.vocab_size));
    std::vector<SeqTree> batch = {Chain(gpu.CreateSequence(), 0, prompt),
                                  RandomTree(gpu.CreateSequence(), 0, 6, config.vocab_size, rng)};
    SeqTree first = batch[1];  // the tree's first two nodes come from an earlier forward
    first.tokens.resize(2);
    first.parents.resize(2);
    ASSERT_TRUE(gpu.Forward({first}).ok());
    batch[1].first_new = 2;
    int entries = 0, swaps = 0;
    for (const auto& [k, rows] :
         {std::pair{16, TopKRows::kAllNew}, std::pair{1, TopKRows::kAllNew},
          std::pair{1000, TopKRows::kLastNew}, std::pair{5000, TopKRows::kLastNew}}) {
      SCOPED_TRACE(::testing::Message() << "k " << k);
      auto device = gpu.ForwardTopK(batch, k, rows);
      auto host = gpu.CausalLm::ForwardTopK(batch, k, rows);
      ASSERT_TRUE(device.ok() && host.ok()) << device.status() << " " << host.status();
      ASSERT_EQ(device->size(), rows == TopKRows::kAllNew ? 11u : 2u);
      ASSERT_EQ(device->size(), host->size());
      for (size_t r = 0; r < host->size(); ++r) {
        const std::vector<TokenLogProb>& a = (*host)[r];
        const std::vector<TokenLogProb>& b = (*device)[r];
        ASSERT_EQ(a.size(), std::min<size_t>(k, config.vocab_size)) << "row " << r;
        ASSERT_EQ(b.size(), a.size()) << "row " << r;
        for (size_t j = 0; j < a.size(); ++j) {
          const double tol = 1e-5 * (1 + std::fabs(a[j].logprob));
          ASSERT_NEAR(b[j].logprob, a[j].logprob, tol) << "row " << r << " rank " << j;
          ++entries;
          if (b[j].token == a[j].token) continue;
          // Only a tie within the lse's ulp may swap: the host ranks the device's token at a
          // log-prob that close (or just past its list).
          ++swaps;
          const auto at = std::find_if(
              a.begin(), a.end(), [&](const TokenLogProb& t) { return t.token == b[j].token; });
          ASSERT_TRUE(at == a.end() ? j + 3 >= a.size()
                                    : std::fabs(at->logprob - a[j].logprob) <= 2 * tol)
              << "row " << r << " rank " << j << ": token " << b[j].token
              << " where the host ranks " << a[j].token;
        }
      }
    }
    std::cerr << "device top-k: " << swaps << " of " << entries
              << " ranked entries swapped at ulp-level ties\n";
    EXPECT_LE(swaps, entries / 50);
    EXPECT_EQ(gpu.ForwardTopK(batch, 0, TopKRows::kAllNew).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace treespec::gpu
