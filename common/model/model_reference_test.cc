// The CPU model against Hugging Face transformers (tests/data/model_reference.json, written by
// tools/train/references.py: fp32 eager attention on the CPU from the stored checkpoints).
//
// For every model and case:
//  - first_logits (the logits at the last prompt position) agree within 1e-4 relative, where
//    relative means max_v |ours_v - theirs_v| / max_v |theirs_v| (the file keeps 6 significant
//    digits, 5e-6 relative; both sides compute in fp32 from the same weights, and the
//    summation orders differ, which costs ~1e-6 on these models);
//  - greedy_ids (argmax continuation) are reproduced exactly by incremental decoding: one
//    prefill, then one token per Forward through the KV cache.
// Both with tensor_parallel 1 and 3 (3 splits these 4-head models unevenly). The target
// features (layer outputs) against tests/data/feature_reference.json likewise.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/causal_lm.h"
#include "common/model/dtype.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

constexpr double kFirstLogitsRel = 1e-4;

std::string ReferencePath() {
  return std::string(TREESPEC_SOURCE_DIR) + "/tests/data/model_reference.json";
}

int32_t Argmax(const float* row, int vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// The gap between the best and second-best logit, to tell a near-tie from a real bug.
float TopTwoMargin(const float* row, int vocab) {
  float best = -INFINITY, second = -INFINITY;
  for (int v = 0; v < vocab; ++v) {
    if (row[v] > best) {
      second = best;
      best = row[v];
    } else if (row[v] > second) {
      second = row[v];
    }
  }
  return best - second;
}

TEST(ModelReferenceTest, MatchesTransformers) {
  std::ifstream in(ReferencePath());
  ASSERT_TRUE(in.good()) << "missing " << ReferencePath()
                         << " (produced by tools/train/references.py); this test cannot pass "
                            "without it";
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_TRUE(ref.contains("models") && !ref["models"].empty());

  int cases_checked = 0;
  for (const auto& model : ref["models"]) {
    const std::string dir =
        std::string(TREESPEC_SOURCE_DIR) + "/" + model["dir"].get<std::string>();
    for (int tp : {1, 3}) {
      LmOptions options;
      options.tensor_parallel = tp;
      options.kv_pages = 64;  // 1024 slots: the longest prompt plus its continuation
      auto lm = LoadCpuCausalLm(dir, options);
      ASSERT_TRUE(lm.ok()) << dir << ": " << lm.status();
      const int vocab = (*lm)->config().vocab_size;
      ASSERT_EQ(vocab, model["vocab_size"].get<int>()) << dir;

      for (size_t ci = 0; ci < model["cases"].size(); ++ci) {
        const auto& c = model["cases"][ci];
        const std::string where = dir + " tp " + std::to_string(tp) + " case " + std::to_string(ci);
        const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
        const auto want_ids = c["greedy_ids"].get<std::vector<int32_t>>();
        const auto want_logits = c["first_logits"].get<std::vector<float>>();
        ASSERT_EQ(static_cast<int>(want_logits.size()), vocab) << where;

        CausalLm& m = **lm;
        const SeqId seq = m.CreateSequence();
        std::vector<int32_t> parents(prompt.size());
        for (size_t i = 0; i < prompt.size(); ++i) parents[i] = static_cast<int32_t>(i) - 1;
        auto out = m.Forward({{seq, 0, prompt, parents, 0}});
        ASSERT_TRUE(out.ok()) << where << ": " << out.status();
        const float* last = out->data() + (prompt.size() - 1) * vocab;

        double diff = 0, scale = 0;
        for (int v = 0; v < vocab; ++v) {
          diff = std::max(diff, std::abs(static_cast<double>(last[v]) - want_logits[v]));
          scale = std::max(scale, std::abs(static_cast<double>(want_logits[v])));
        }
        EXPECT_LT(diff / scale, kFirstLogitsRel)
            << where << ": max |diff| " << diff << ", max |logit| " << scale;
        if (tp == 1) std::printf("%s: first_logits rel diff %.2g\n", where.c_str(), diff / scale);

        std::vector<int> commit(prompt.size());
        for (size_t i = 0; i < prompt.size(); ++i) commit[i] = static_cast<int>(i);
        m.Commit(seq, 0, commit);
        int committed = static_cast<int>(prompt.size());
        std::vector<float> row(last, last + vocab);
        for (size_t step = 0; step < want_ids.size(); ++step) {
          const int32_t next = Argmax(row.data(), vocab);
          if (next != want_ids[step]) {
            ADD_FAILURE() << where << ": greedy step " << step << " chose " << next
                          << ", transformers chose " << want_ids[step]
                          << "; our top-2 margin there " << TopTwoMargin(row.data(), vocab);
            break;
          }
          auto step_out = m.Forward({{seq, committed, {next}, {-1}, 0}});
          ASSERT_TRUE(step_out.ok()) << where << ": " << step_out.status();
          m.Commit(seq, committed, std::vector<int>{0});
          ++committed;
          row = *step_out;
        }
        m.FreeSequence(seq);
        ++cases_checked;
      }
    }
  }
  std::printf("checked %d cases\n", cases_checked);
}

// Target features (the verify step's capture of layer outputs) against Transformers' decoder
// layer outputs (tests/data/feature_reference.json, written by tools/feature_reference.py).
// Ours are rounded to bf16 (the wire's type): each value within 2^-8 of its own magnitude plus
// 1e-4 of the row's scale (fp32 summation order), with TP 1 and 3.
TEST(ModelReferenceTest, FeaturesMatchTransformers) {
  const std::string path = std::string(TREESPEC_SOURCE_DIR) + "/tests/data/feature_reference.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing " << path << " (produced by tools/feature_reference.py)";
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_FALSE(ref["models"].empty());
  for (const auto& model : ref["models"]) {
    const std::string dir =
        std::string(TREESPEC_SOURCE_DIR) + "/" + model["dir"].get<std::string>();
    const auto layers = model["layers"].get<std::vector<int>>();
    const auto prompt = model["prompt_ids"].get<std::vector<int32_t>>();
    const auto rows = model["rows"].get<std::vector<std::vector<float>>>();
    for (int tp : {1, 3}) {
      LmOptions options;
      options.tensor_parallel = tp;
      options.kv_pages = 8;
      auto lm = LoadCpuCausalLm(dir, options);
      ASSERT_TRUE(lm.ok()) << dir << ": " << lm.status();
      ASSERT_TRUE((*lm)->SetFeatureLayers(layers).ok());
      std::vector<int32_t> parents(prompt.size());
      for (size_t i = 0; i < prompt.size(); ++i) parents[i] = static_cast<int32_t>(i) - 1;
      StepSpec spec;
      spec.prefill = true;
      spec.capture_features = true;
      auto step = (*lm)->VerifyStep({{(*lm)->CreateSequence(), 0, prompt, parents, 0}}, {spec});
      ASSERT_TRUE(step.ok()) << dir << ": " << step.status();
      const TargetFeatures& got = (*step)[0].features;
      ASSERT_EQ(got.rows, static_cast<int>(rows.size())) << dir;
      ASSERT_EQ(got.width, static_cast<int>(rows[0].size())) << dir;
      double worst = 0;
      for (int t = 0; t < got.rows; ++t) {
        double scale = 0;
        for (float v : rows[t]) scale = std::max(scale, std::abs(static_cast<double>(v)));
        for (int c = 0; c < got.width; ++c) {
          const double want = rows[t][c];
          const double ours = Bf16BitsToFloat(got.bf16[static_cast<size_t>(t) * got.width + c]);
          const double err = std::abs(ours - want);
          worst = std::max(worst, err / scale);
          ASSERT_LE(err, std::abs(want) / 256 + 1e-4 * scale)
              << dir << " tp " << tp << " token " << t << " column " << c << ": ours " << ours
              << ", transformers " << want;
        }
      }
      std::printf("%s tp %d: %d feature rows, worst error %.2g of the row's scale\n", dir.c_str(),
                  tp, got.rows, worst);
    }
  }
}

}  // namespace
}  // namespace treespec
