// Speculation on the GPU (DESIGN §3, §8): the tiny target on the CUDA backend, verified against
// trees from the tiny draft model and from the tiny DFlash drafter; greedy output with
// speculation must equal target-only greedy output on the same GPU, token for token, on the
// held-out prompts. In bf16 a tree node and the same token decoded alone run different GEMM
// shapes, so an exact tie can break differently; where the outputs diverge the test recomputes
// the target's top-2 logit margin at that position and requires it to be within the error bound
// measured against the CPU (cuda_causal_lm_test: 4 % of the row's scale), and reports how often
// it happened.
// Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/load_model.h"
#include "common/cuda/cuda_causal_lm.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/tokenizer/tokenizer.h"
#include "drafter_service/dflash_drafter.h"
#include "drafter_service/draft_model_drafter.h"
#include "gtest/gtest.h"
#include "verifier_service/engine.h"
#include "verifier_service/engine_test_util.h"

namespace treespec {
namespace {

std::string Path(const std::string& rel) { return absl::StrCat(TREESPEC_SOURCE_DIR, "/", rel); }

std::vector<std::vector<int32_t>> HeldOutPrompts(const Tokenizer& tokenizer, int count) {
  std::ifstream in(Path("tests/data/heldout_prompts.jsonl"));
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  while (static_cast<int>(prompts.size()) < count && std::getline(in, line)) {
    auto ids = tokenizer.Encode(nlohmann::json::parse(line)["text"].get<std::string>());
    if (ids.ok()) prompts.push_back(*ids);
  }
  return prompts;
}

// The error bound of a logit against the CPU (cuda_causal_lm_test), relative to the row's largest
// |logit|: a top-2 margin within it is a near-tie, which bf16 kernels may break either way.
constexpr double kTieMargin = 0.04;

// The target's top-2 margin (relative to the row's largest |logit|) after each prefix of
// `context` that ends at or after `from` tokens: [context.size() - from + 1].
std::vector<double> TopTwoMargins(CausalLm& model, const std::vector<int32_t>& context,
                                  size_t from) {
  const SeqId seq = model.CreateSequence();
  SeqTree chain;
  chain.seq = seq;
  chain.tokens = context;
  for (size_t i = 0; i < context.size(); ++i) chain.parents.push_back(static_cast<int>(i) - 1);
  auto logits = model.Forward({chain});
  model.FreeSequence(seq);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  const int vocab = model.config().vocab_size;
  std::vector<double> margins;
  for (size_t end = from; end <= context.size(); ++end) {
    const float* row = logits->data() + (end - 1) * vocab;
    std::vector<float> sorted(row, row + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double scale = 0;
    for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(static_cast<double>(row[v])));
    margins.push_back((sorted[0] - sorted[1]) / scale);
  }
  return margins;
}

// How a speculative run drafts: which kind, through which source, with which limits.
struct SpecRun {
  DrafterKind kind;
  DraftSource* drafts;
  SpecLimits limits;
};

// Greedy decoding of 12 held-out prompts on `target`, speculation off and then on: where the
// two diverge, the target's top-2 margin there must be a near-tie (the check that tells a tie
// from a bug), and at most half of the prompts may diverge. The report gives how many of plain
// decoding's tokens were chosen at a near-tie: each is a coin that a step of another shape (a
// tree's rows run other GEMM kernels and attention splits than one row's) may flip.
void CheckSpeculativeGreedyEqualsTargetOnly(CausalLm& target, const SpecRun& run) {
  auto tokenizer = LoadTokenizer(Path("models/tiny-target/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  int steps = 0, drafted = 0, accepted = 0, diverged = 0, close = 0;
  const std::vector<std::vector<int32_t>> prompts = HeldOutPrompts(**tokenizer, 12);
  ASSERT_EQ(prompts.size(), 12u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    GenerationRequest r;
    r.id = absl::StrCat("prompt ", p);
    r.prompt = prompts[p];
    r.max_new_tokens = 64;
    r.ignore_eos = true;
    r.spec = run.limits;
    r.spec_mode = SpecMode::Off();
    Engine plain_engine(&target, nullptr, nullptr, EngineOptions());
    const GenerationUpdate plain = testing::RunToEnd(plain_engine, r);
    ASSERT_TRUE(plain.status.ok()) << plain.status;
    std::vector<int32_t> full = prompts[p];
    full.insert(full.end(), plain.token_ids.begin(), plain.token_ids.end() - 1);
    for (double margin : TopTwoMargins(target, full, prompts[p].size())) {
      if (margin <= kTieMargin) ++close;
    }
    r.spec_mode = SpecMode::Of(run.kind);
    Engine spec_engine(&target, nullptr, run.drafts, EngineOptions());
    const GenerationUpdate spec = testing::RunToEnd(spec_engine, r);
    ASSERT_TRUE(spec.status.ok()) << spec.status;
    steps += spec.stats.steps;
    drafted += spec.stats.drafted_tokens;
    accepted += spec.stats.accepted_tokens;
    ASSERT_EQ(spec.token_ids.size(), plain.token_ids.size());
    const auto mismatch =
        std::mismatch(spec.token_ids.begin(), spec.token_ids.end(), plain.token_ids.begin());
    if (mismatch.first == spec.token_ids.end()) continue;
    ++diverged;
    std::vector<int32_t> context = prompts[p];
    context.insert(context.end(), plain.token_ids.begin(), mismatch.second);
    const double margin = TopTwoMargins(target, context, context.size()).at(0);
    std::cerr << "prompt " << p << " diverges at token "
              << (mismatch.first - spec.token_ids.begin()) << "; top-2 margin there " << margin
              << " of the row's scale\n";
    EXPECT_LE(margin, kTieMargin) << "prompt " << p << ": a divergence that is not a near-tie";
  }
  const double mean_acceptance = steps > 0 ? 1.0 + static_cast<double>(accepted) / steps : 0;
  std::cerr << prompts.size() << " prompts: " << diverged << " diverged at near-ties, plain "
            << "decoding chose " << close << " tokens at a near-tie; " << steps << " verify steps, "
            << drafted << " drafted, " << accepted << " accepted, mean acceptance length "
            << mean_acceptance << "\n";
  EXPECT_LE(diverged, static_cast<int>(prompts.size()) / 2) << "near-ties should be rare";
  EXPECT_GT(mean_acceptance, 2.5) << "the draft tree should be accepted several tokens deep";
}

// The target runs tensor-parallel over GPUs 0..tp-1; the draft model (16-node trees) on one GPU.
void CheckDraftModelSpeculation(int tp) {
  LmOptions lm;
  lm.max_batch = 8;
  lm.tensor_parallel = tp;
  auto target = gpu::LoadCudaCausalLm(Path("models/tiny-target"), lm);
  ASSERT_TRUE(target.ok()) << target.status();
  lm.tensor_parallel = 1;
  auto draft = gpu::LoadCudaCausalLm(Path("models/tiny-draft"), lm);
  ASSERT_TRUE(draft.ok()) << draft.status();
  DraftModelOptions draft_options;
  draft_options.shape = DraftShape::kTree;
  DraftModelDrafterFactory factory(*std::move(draft), draft_options);
  testing::LocalDraftSource drafts(&factory);
  CheckSpeculativeGreedyEqualsTargetOnly(**target,
                                         {DrafterKind::kDraftModel, &drafts, SpecLimits{16, 8}});
}

TEST(EngineGpuTest, SpeculativeGreedyEqualsTargetOnly) {
  if (!gpu::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  CheckDraftModelSpeculation(1);
}

// DFlash on the GPU with DDTree trees of 64 nodes, 15 deep (the e2e benchmark's), fed the verify
// step's captured target features: 65-row verify steps, where the GEMMs run cuBLASLt and the
// attention splits differently from plain decoding's, so near-ties may break either way.
TEST(EngineGpuTest, DflashSpeculativeGreedyEqualsTargetOnly) {
  if (!gpu::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  LmOptions lm;
  lm.max_batch = 8;
  auto target = gpu::LoadCudaCausalLm(Path("models/tiny-target"), lm);
  ASSERT_TRUE(target.ok()) << target.status();
  absl::StatusOr<DflashLm> dflash =
      LoadDflashLm(Path("models/tiny-dflash"), Path("models/tiny-target"), "cuda", lm);
  ASSERT_TRUE(dflash.ok()) << dflash.status();
  DflashDrafterFactory factory(std::move(dflash->config), std::move(dflash->lm), DflashOptions());
  const SpecLimits limits{64, 15, 64};
  DrafterPoolInfo pool{1, limits, {DrafterKind::kDflash}};
  pool.feature_needs = {{DrafterKind::kDflash, factory.features()}};
  testing::StatedPoolSource drafts(&factory, pool);
  CheckSpeculativeGreedyEqualsTargetOnly(**target, {DrafterKind::kDflash, &drafts, limits});
}

// A session of a kind that reads target features is sent, commit by commit, the GPU verify
// step's captured layers of every context token but the pending bonus; together they match the
// CPU backend's capture of the same tokens within bf16 error (cuda_causal_lm_test's bound).
TEST(EngineGpuTest, AFeatureDrafterGetsTheFeaturesOfEveryContextToken) {
  if (!gpu::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  LmOptions lm;
  lm.max_batch = 8;
  auto target = gpu::LoadCudaCausalLm(Path("models/tiny-target"), lm);
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = gpu::LoadCudaCausalLm(Path("models/tiny-draft"), lm);
  ASSERT_TRUE(draft.ok()) << draft.status();
  auto cpu = LoadCpuCausalLm(Path("models/tiny-target"), lm);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto tokenizer = LoadTokenizer(Path("models/tiny-target/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const ModelConfig& c = (*target)->config();
  const FeatureSpec needs{{1, 3, 5}, c.hidden_size, c.num_layers, c.vocab_size};
  DraftModelOptions draft_options;
  draft_options.shape = DraftShape::kTree;
  DraftModelDrafterFactory draft_model(*std::move(draft), draft_options);
  testing::RecordingFactory recording(&draft_model, needs);
  DrafterPoolInfo pool{1, SpecLimits{16, 8, 16}, {DrafterKind::kDflash}};
  pool.feature_needs = {{DrafterKind::kDflash, needs}};
  testing::StatedPoolSource drafts(&recording, pool);
  Engine engine(target->get(), nullptr, &drafts, EngineOptions());
  ASSERT_TRUE((*cpu)->SetFeatureLayers(needs.layers).ok());
  for (const std::vector<int32_t>& prompt : HeldOutPrompts(**tokenizer, 3)) {
    GenerationRequest r;
    r.id = "features";
    r.prompt = prompt;
    r.max_new_tokens = 48;
    r.ignore_eos = true;
    r.spec_mode = SpecMode::Of(DrafterKind::kDflash);
    const GenerationUpdate out = testing::RunToEnd(engine, r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_GT(out.stats.MeanAcceptanceLength(), 1.5);
    const DraftContext& got = recording.log();
    const int tokens = static_cast<int>(got.tokens.size());
    // The prompt, then the output up to the last commit (a finished request's last step
    // commits nothing).
    ASSERT_GT(tokens, static_cast<int>(prompt.size()) + 8);
    ASSERT_LE(tokens, static_cast<int>(prompt.size()) + out.completion_tokens);
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), out.token_ids.begin(), out.token_ids.end());
    ASSERT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), context.begin()));
    ASSERT_EQ(got.features.rows, tokens - 1);
    SeqTree chain;
    chain.seq = (*cpu)->CreateSequence();
    chain.tokens.assign(got.tokens.begin(), got.tokens.end() - 1);
    for (int i = 0; i + 1 < tokens; ++i) chain.parents.push_back(i - 1);
    StepSpec spec;
    spec.prefill = true;
    spec.capture_features = true;
    auto want = (*cpu)->VerifyStep({chain}, {spec});
    ASSERT_TRUE(want.ok()) << want.status();
    (*cpu)->FreeSequence(chain.seq);
    const double worst =
        testing::WorstFeatureError(got.features, (*want)[0].features, c.hidden_size);
    std::cerr << "features through the engine: " << got.features.rows << " rows, worst error "
              << worst << " of the layer's scale\n";
    EXPECT_LT(worst, 0.05);
  }
}

TEST(EngineGpuTest, TensorParallelTargetSpeculativeGreedyEqualsTargetOnly) {
  if (gpu::CudaDeviceCount() < 2) GTEST_SKIP() << "fewer than 2 GPUs: TP=2 test skipped";
  CheckDraftModelSpeculation(2);
}

}  // namespace
}  // namespace treespec
