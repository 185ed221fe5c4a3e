// Target features from the verify step (CausalLm::SetFeatureLayers, StepSpec::capture_features)
// on the CPU backend, the oracle for every other backend:
//  - the rows a speculative run keeps, step by step (prefill: the prompt; then the old bonus and
//    the accepted tokens of each step), equal bitwise the rows of one prefill of the same
//    committed tokens, and capturing changes no emitted token;
//  - the last layer's rows are the residual stream itself: its final norm times the LM head
//    gives the step's logits (to bf16 rounding);
//  - with TP 2 the rows equal TP 1's (to fp32 summation order, then bf16).
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_ops.h"
#include "common/model/cpu_test_util.h"
#include "common/model/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;

ModelConfig FourLayers() {
  ModelConfig c = testing::SmallLlamaConfig();
  c.num_layers = 4;
  return c;
}

std::unique_ptr<CausalLm> NewLm(const ModelConfig& config, int tp) {
  LmOptions options;
  options.tensor_parallel = tp;
  options.max_batch = 2;
  absl::StatusOr<std::unique_ptr<CausalLm>> lm =
      CreateCpuCausalLm(config, testing::RandomWeights(config, 5), options);
  EXPECT_TRUE(lm.ok()) << lm.status();
  return lm.ok() ? *std::move(lm) : nullptr;
}

std::vector<int32_t> Chain(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = i - 1;
  return p;
}

StepResult Step(CausalLm& lm, const SeqTree& tree, bool prefill, bool capture) {
  StepSpec spec;
  spec.prefill = prefill;
  spec.capture_features = capture;
  absl::StatusOr<std::vector<StepResult>> r = lm.VerifyStep({tree}, {spec});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)[0] : StepResult{};
}

// Greedy decoding of `n` tokens after `prompt`, one verify step per token, without capture.
std::vector<int32_t> Greedy(CausalLm& lm, const std::vector<int32_t>& prompt, int n) {
  const SeqId seq = lm.CreateSequence();
  std::vector<int32_t> out =
      Step(lm, {seq, 0, prompt, Chain(prompt.size()), 0}, true, false).emitted;
  int len = static_cast<int>(prompt.size());
  while (static_cast<int>(out.size()) < n) {
    out.push_back(Step(lm, {seq, len, {out.back()}, {-1}, 0}, false, false).emitted[0]);
    ++len;
  }
  lm.FreeSequence(seq);
  return out;
}

struct SpeculativeRun {
  std::vector<int32_t> committed;  // every token whose row was captured, in order
  TargetFeatures rows;
  std::vector<int32_t> emitted;  // every emitted token
};

// Prefill, then verify steps whose trees hold the next `accept` greedy tokens as a chain below
// the bonus plus a wrong sibling at each depth, capturing every kept row.
SpeculativeRun Speculate(CausalLm& lm, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& greedy, bool capture) {
  SpeculativeRun run;
  const SeqId seq = lm.CreateSequence();
  StepResult first = Step(lm, {seq, 0, prompt, Chain(prompt.size()), 0}, true, capture);
  run.committed = prompt;
  run.rows.Append(first.features);
  run.emitted = first.emitted;
  std::mt19937 rng(3);
  const int vocab = lm.config().vocab_size;
  int at = 1;  // greedy[at] is the next token after the bonus greedy[at - 1]
  for (int step = 0; at + 4 < static_cast<int>(greedy.size()); ++step) {
    const int accept = step % 4;  // 0..3 accepted tokens
    SeqTree tree{seq, static_cast<int>(run.committed.size()), {greedy[at - 1]}, {-1}, 0};
    int parent = 0;
    for (int d = 0; d <= accept; ++d) {
      // A wrong sibling first, then the right token (unless this depth rejects everything).
      tree.tokens.push_back((greedy[at + d] + 1 + static_cast<int>(rng() % 7)) % vocab);
      tree.parents.push_back(parent);
      if (d == accept) break;
      tree.tokens.push_back(greedy[at + d]);
      tree.parents.push_back(parent);
      parent = static_cast<int>(tree.tokens.size()) - 1;
    }
    StepResult r = Step(lm, tree, false, capture);
    EXPECT_EQ(r.path.size(), static_cast<size_t>(accept + 1)) << "step " << step;
    for (int node : r.path) run.committed.push_back(tree.tokens[node]);
    if (capture) {
      EXPECT_EQ(r.features.rows, static_cast<int>(r.path.size()));
    } else {
      EXPECT_TRUE(r.features.empty());
    }
    run.rows.Append(r.features);
    run.emitted.insert(run.emitted.end(), r.emitted.begin(), r.emitted.end());
    at += accept + 1;
  }
  lm.FreeSequence(seq);
  return run;
}

class FeatureCaptureTest : public ::testing::TestWithParam<int> {};

TEST_P(FeatureCaptureTest, KeptRowsEqualAPrefillOfTheCommittedTokens) {
  const ModelConfig config = FourLayers();
  std::unique_ptr<CausalLm> lm = NewLm(config, GetParam());
  ASSERT_NE(lm, nullptr);
  ASSERT_TRUE(lm->SetFeatureLayers({0, 2}).ok());
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(9);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % config.vocab_size);
  const std::vector<int32_t> greedy = Greedy(*lm, prompt, 40);

  const SpeculativeRun with = Speculate(*lm, prompt, greedy, true);
  const SpeculativeRun without = Speculate(*lm, prompt, greedy, false);
  EXPECT_EQ(with.emitted, without.emitted);
  EXPECT_EQ(with.committed, without.committed);
  ASSERT_EQ(with.rows.rows, static_cast<int>(with.committed.size()));
  EXPECT_EQ(with.rows.width, 2 * config.hidden_size);
  EXPECT_TRUE(CheckTargetFeatures(with.rows, "rows").ok());

  const SeqId seq = lm->CreateSequence();
  const StepResult all =
      Step(*lm, {seq, 0, with.committed, Chain(with.committed.size()), 0}, true, true);
  EXPECT_EQ(all.features.rows, with.rows.rows);
  EXPECT_EQ(all.features.bf16, with.rows.bf16);
}

TEST_P(FeatureCaptureTest, TheLastLayersRowsGiveTheLogits) {
  const ModelConfig config = FourLayers();
  const ModelWeights weights = testing::RandomWeights(config, 5);
  std::unique_ptr<CausalLm> lm = NewLm(config, GetParam());
  ASSERT_NE(lm, nullptr);
  ASSERT_TRUE(lm->SetFeatureLayers({1, 3}).ok());
  const std::vector<int32_t> prompt = {5, 17, 300, 2, 99, 41};
  const int n = static_cast<int>(prompt.size()), hidden = config.hidden_size;
  const StepResult r = Step(*lm, {lm->CreateSequence(), 0, prompt, Chain(n), 0}, true, true);
  ASSERT_EQ(r.features.rows, n);
  // The logits of the prompt's rows, from a second sequence.
  absl::StatusOr<std::vector<float>> logits =
      lm->Forward({{lm->CreateSequence(), 0, prompt, Chain(n), 0}});
  ASSERT_TRUE(logits.ok()) << logits.status();
  std::vector<float> x(hidden), h(hidden);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < hidden; ++c) {
      x[c] = Bf16BitsToFloat(r.features.bf16[static_cast<size_t>(i) * 2 * hidden + hidden + c]);
    }
    RmsNorm(x.data(), weights.final_norm.data(), 1, hidden, config.rms_norm_eps, h.data());
    double max_err = 0, max_ref = 0;
    for (int v = 0; v < config.vocab_size; ++v) {
      double dot = 0;
      for (int c = 0; c < hidden; ++c) dot += double{h[c]} * weights.embed.row(v)[c];
      const double ref = (*logits)[static_cast<size_t>(i) * config.vocab_size + v];
      max_err = std::max(max_err, std::abs(dot - ref));
      max_ref = std::max(max_ref, std::abs(ref));
    }
    // bf16 keeps 8 bits: a relative error of 2^-9 per value, averaging out over the dot.
    EXPECT_LT(max_err / max_ref, 1e-2) << "row " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, FeatureCaptureTest, ::testing::Values(1, 2));

TEST(FeatureCaptureTest, TensorParallelRowsEqualSingleRanksToBf16) {
  const ModelConfig config = FourLayers();
  const std::vector<int32_t> prompt = {7, 8, 9, 10, 11, 12, 13};
  TargetFeatures rows[2];
  for (int tp : {1, 2}) {
    std::unique_ptr<CausalLm> lm = NewLm(config, tp);
    ASSERT_TRUE(lm->SetFeatureLayers({0, 1, 2}).ok());
    rows[tp - 1] = Step(*lm, {lm->CreateSequence(), 0, prompt, Chain(7), 0}, true, true).features;
  }
  ASSERT_EQ(rows[0].bf16.size(), rows[1].bf16.size());
  int differ = 0;
  for (size_t i = 0; i < rows[0].bf16.size(); ++i) {
    const float a = Bf16BitsToFloat(rows[0].bf16[i]), b = Bf16BitsToFloat(rows[1].bf16[i]);
    EXPECT_LE(std::abs(a - b), std::abs(a) * (1.0f / 128) + 1e-6f) << i;
    differ += rows[0].bf16[i] != rows[1].bf16[i];
  }
  EXPECT_LT(differ, static_cast<int>(rows[0].bf16.size()) / 10);  // only rounding-edge values
}

TEST(FeatureCaptureTest, LayersAreCheckedAndCaptureNeedsThem) {
  std::unique_ptr<CausalLm> lm = NewLm(FourLayers(), 1);
  EXPECT_THAT(lm->SetFeatureLayers({2, 1}).message(),
              HasSubstr("feature layers [2, 1] must be strictly ascending within [0, 4)"));
  EXPECT_EQ(lm->SetFeatureLayers({4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lm->SetFeatureLayers({-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lm->SetFeatureLayers({1, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(lm->feature_layers().empty());
  StepSpec spec;
  spec.prefill = true;
  spec.capture_features = true;
  const absl::Status none =
      lm->VerifyStep({{lm->CreateSequence(), 0, {1, 2}, Chain(2), 0}}, {spec}).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("batch entry 0 asks for target features"));
  ASSERT_TRUE(lm->SetFeatureLayers({3}).ok());
  EXPECT_EQ(lm->feature_layers(), std::vector<int>{3});
  ASSERT_TRUE(lm->SetFeatureLayers({}).ok());
  EXPECT_TRUE(lm->feature_layers().empty());
}

}  // namespace
}  // namespace treespec
