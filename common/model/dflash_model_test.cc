// The DFlash drafter on the CPU: its config.json and weights load (and bad ones are refused
// naming the field or tensor), and a CPU CausalLm of its body — context rows appended in
// chunks as sessions append them (AppendContext), then the block as a bidirectional tree —
// gives the block logits of PyTorch with Transformers' Qwen3 modules (tools/dflash_reference.py).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/dflash_config.h"
#include "common/model/dflash_weights.h"
#include "common/model/dtype.h"
#include "common/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string Source(const std::string& rel) { return std::string(TREESPEC_SOURCE_DIR) + "/" + rel; }

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

Json RandomDrafterConfig() {
  return ReadJson(Source("tests/data/models/dflash_random/config.json"));
}

TEST(DflashConfigTest, ParsesTheDraftLayersAndWhatTheyReadFromTheTarget) {
  absl::StatusOr<DflashConfig> c = ParseDflashConfig(RandomDrafterConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->body.num_layers, 2);
  EXPECT_EQ(c->body.hidden_size, 256);
  EXPECT_TRUE(c->body.qk_norm);
  EXPECT_EQ(c->block_size, 8);
  EXPECT_EQ(c->mask_token_id, 4095);
  EXPECT_EQ(c->features(), (FeatureSpec{{1, 4}, 256, 6, 4096}));
  EXPECT_EQ(c->features().width(), 512);
}

TEST(DflashConfigTest, BadOrUnsupportedFieldsAreNamed) {
  auto refused = [](const std::function<void(Json&)>& edit) {
    Json j = RandomDrafterConfig();
    edit(j);
    return ParseDflashConfig(j.dump()).status();
  };
  absl::Status s = refused([](Json& j) { j["architectures"] = {"DFlash2DraftModel"}; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'DFlash2DraftModel' is not supported"));
  s = refused([](Json& j) { j["is_causal"] = true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  s = refused([](Json& j) { j["dflash_config"].erase("target_layer_ids"); });
  EXPECT_THAT(std::string(s.message()), HasSubstr("`dflash_config.target_layer_ids`"));
  s = refused([](Json& j) { j["dflash_config"]["target_layer_ids"] = {4, 1}; });
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("[4, 1] must be strictly ascending within [0, 6)"));
  s = refused([](Json& j) { j.erase("num_target_layers"); });
  EXPECT_THAT(std::string(s.message()), HasSubstr("`num_target_layers`"));
  s = refused([](Json& j) { j["dflash_config"]["mask_token_id"] = 4096; });
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("`dflash_config.mask_token_id`: expected a token id in [0, 4096)"));
  s = refused([](Json& j) { j["block_size"] = 1; });
  EXPECT_THAT(std::string(s.message()), HasSubstr("`block_size`: must be >= 2"));
  s = refused([](Json& j) { j["hidden_act"] = "gelu"; });  // the Qwen3 body's own checks
  EXPECT_THAT(std::string(s.message()), HasSubstr("hidden_act"));
}

TEST(DflashWeightsTest, ATargetOfAnotherShapeOrAnExtraTensorIsRefused) {
  const std::string drafter = Source("tests/data/models/dflash_random");
  absl::StatusOr<DflashConfig> c = LoadDflashConfig(drafter);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelWeights> w =
      LoadDflashWeights(drafter, *c, Source("tests/data/models/qwen3_qknorm"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("was trained for a target of hidden 256, 6 layers, vocab 4096"));

  // A copy of the drafter with one more tensor than config.json describes.
  const std::string dir = ::testing::TempDir() + "/dflash_extra";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(drafter + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  w = LoadDflashWeights(drafter, *c, Source("models/tiny-target"));
  ASSERT_TRUE(w.ok()) << w.status();
  ForEachDflashTensor(*c, *w, [&](TensorSlot& slot) {
    if (slot.present) tensors.push_back({slot.hf_name, slot.tensor});
  });
  Tensor extra({4});
  tensors.push_back({"layers.2.input_layernorm.weight", &extra});
  std::sort(tensors.begin(), tensors.end());  // the writer takes them in name order
  const absl::Status written = WriteSafetensors(dir + "/model.safetensors", tensors, DType::kBF16);
  ASSERT_TRUE(written.ok()) << written;
  w = LoadDflashWeights(dir, *c, Source("models/tiny-target"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("'layers.2.input_layernorm.weight' are not used"));
  std::filesystem::remove_all(dir);
}

// The drafter as a CPU CausalLm (what LoadDflashLm makes on --device=cpu).
struct CpuDflash {
  DflashConfig config;
  std::unique_ptr<CausalLm> lm;
};
CpuDflash LoadCpuDflash(const std::string& drafter, const std::string& target) {
  CpuDflash d;
  absl::StatusOr<DflashConfig> config = LoadDflashConfig(drafter);
  EXPECT_TRUE(config.ok()) << config.status();
  d.config = *config;
  absl::StatusOr<ModelWeights> weights = LoadDflashWeights(drafter, d.config, target);
  EXPECT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<CausalLm>> lm =
      CreateCpuCausalLm(d.config.body, *std::move(weights), LmOptions{.max_batch = 2});
  EXPECT_TRUE(lm.ok()) << lm.status();
  d.lm = *std::move(lm);
  return d;
}

TEST(DflashModelTest, BlockLogitsMatchPyTorch) {
  const Json ref = ReadJson(Source("tests/data/dflash_reference.json"));
  CpuDflash d = LoadCpuDflash(Source(ref["drafter"]), Source(ref["target"]));
  ASSERT_NE(d.lm, nullptr);
  const std::vector<int> probes = ref["probe_ids"].get<std::vector<int>>();
  const int width = d.config.features().width();
  const int vocab = d.config.body.vocab_size;
  double worst = 0;
  int blocks = 0;
  for (const Json& c : ref["cases"]) {
    const SeqId seq = d.lm->CreateSequence();
    int context = 0;
    for (size_t step = 0; step < c["chunks"].size(); ++step) {
      TargetFeatures rows;
      for (const Json& row : c["chunks"][step]) {
        for (int bits : row) rows.bf16.push_back(static_cast<uint16_t>(bits));
        ++rows.rows;
      }
      rows.width = width;
      ASSERT_TRUE(d.lm->AppendContext(seq, context, rows).ok());
      context += rows.rows;
      const Json& b = c["blocks"][step];
      const int block = b["block"].get<int>();
      absl::StatusOr<std::vector<float>> logits =
          d.lm->Forward({DflashBlock(d.config, seq, context, b["bonus"].get<int>(), block)});
      ASSERT_TRUE(logits.ok()) << logits.status();
      d.lm->Truncate(seq, context);
      const int n = block - 1;
      ASSERT_EQ(logits->size(), static_cast<size_t>(block) * vocab);
      for (int r = 0; r < n; ++r) {
        const float* row = logits->data() + static_cast<size_t>(r + 1) * vocab;
        double scale = 0;
        for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(double{row[v]}));
        for (size_t p = 0; p < probes.size(); ++p) {
          const double want = b["probe_logits"][r][p].get<double>();
          worst = std::max(worst, std::fabs(row[probes[p]] - want) / scale);
        }
        for (int t = 0; t < 8; ++t) {
          const int id = b["top_ids"][r][t].get<int>();
          worst = std::max(worst, std::fabs(row[id] - b["top_logits"][r][t].get<double>()) / scale);
        }
        // The argmax: the reference's top id, unless the two are a near-tie.
        const int best = static_cast<int>(std::max_element(row, row + vocab) - row);
        const double gap =
            b["top_logits"][r][0].get<double>() - b["top_logits"][r][1].get<double>();
        if (gap > 1e-3 * scale) EXPECT_EQ(best, b["top_ids"][r][0].get<int>()) << "row " << r;
      }
      ++blocks;
    }
    d.lm->FreeSequence(seq);
  }
  EXPECT_EQ(blocks, 4);
  EXPECT_LT(worst, 1e-4) << "worst logit error of the row's scale";
  std::cerr << "DFlash block logits vs PyTorch: " << blocks << " blocks, worst error " << worst
            << " of the row's scale\n";
}

TEST(DflashModelTest, BadInputIsRefused) {
  CpuDflash d =
      LoadCpuDflash(Source("tests/data/models/dflash_random"), Source("models/tiny-target"));
  ASSERT_NE(d.lm, nullptr);
  const SeqId seq = d.lm->CreateSequence();
  TargetFeatures narrow{1, 256, std::vector<uint16_t>(256, 0)};
  absl::Status s = d.lm->AppendContext(seq, 0, narrow);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("this model reads rows of width 512"));
  TargetFeatures row{1, 512, std::vector<uint16_t>(512, 0)};
  EXPECT_EQ(d.lm->AppendContext(seq + 100, 0, row).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.lm->AppendContext(seq, 5, row).code(), absl::StatusCode::kInvalidArgument)
      << "past the reserved slots";
  // A bidirectional tree must be a chain computed whole.
  SeqTree block = DflashBlock(d.config, seq, 0, 5, 4);
  block.parents[2] = 0;
  EXPECT_THAT(std::string(d.lm->Forward({block}).status().message()),
              HasSubstr("a bidirectional tree is a chain"));
  block = DflashBlock(d.config, seq, 0, 5, 4);
  block.first_new = 1;
  EXPECT_EQ(d.lm->Forward({block}).status().code(), absl::StatusCode::kInvalidArgument);
  // An empty context still drafts (the block attends to itself).
  EXPECT_TRUE(d.lm->Forward({DflashBlock(d.config, seq, 0, 5, 4)}).ok());
  // A model without a context projection takes no context rows.
  absl::StatusOr<std::unique_ptr<CausalLm>> target =
      LoadCpuCausalLm(Source("models/tiny-target"), LmOptions{.max_batch = 1});
  ASSERT_TRUE(target.ok());
  const SeqId t = (*target)->CreateSequence();
  EXPECT_EQ((*target)->AppendContext(t, 0, row).code(), absl::StatusCode::kFailedPrecondition);
}

// A bidirectional block sees later nodes: its first row differs from the causal forward's,
// whose first row sees only itself; and equals the causal forward when the block is one node.
TEST(DflashModelTest, BidirectionalBlocksSeeTheWholeBlock) {
  CpuDflash d =
      LoadCpuDflash(Source("tests/data/models/dflash_random"), Source("models/tiny-target"));
  ASSERT_NE(d.lm, nullptr);
  const SeqId seq = d.lm->CreateSequence();
  TargetFeatures rows{3, 512, {}};
  for (int i = 0; i < 3 * 512; ++i) rows.bf16.push_back(FloatToBf16Bits(0.01f * (i % 97) - 0.4f));
  ASSERT_TRUE(d.lm->AppendContext(seq, 0, rows).ok());
  const int vocab = d.config.body.vocab_size;
  auto first_row = [&](bool bidirectional, int n) {
    SeqTree block = DflashBlock(d.config, seq, 3, 7, n);
    block.bidirectional = bidirectional;
    absl::StatusOr<std::vector<float>> logits = d.lm->Forward({block});
    EXPECT_TRUE(logits.ok()) << logits.status();
    d.lm->Truncate(seq, 3);
    return std::vector<float>(logits->begin(), logits->begin() + vocab);
  };
  EXPECT_NE(first_row(true, 4), first_row(false, 4));
  EXPECT_EQ(first_row(true, 1), first_row(false, 1));
}

// Several sequences' rows appended in one call write what appending each alone writes (the
// blocks after them give the same logits, bit for bit: the CPU's sums are batch-invariant), and
// a batch with one bad entry changes no sequence.
TEST(DflashModelTest, ABatchOfAppendsIsEachAppendAlone) {
  CpuDflash d =
      LoadCpuDflash(Source("tests/data/models/dflash_random"), Source("models/tiny-target"));
  ASSERT_NE(d.lm, nullptr);
  auto rows_of = [](int n, int seed) {
    TargetFeatures rows{n, 512, {}};
    for (int i = 0; i < n * 512; ++i) {
      rows.bf16.push_back(FloatToBf16Bits(0.01f * ((i + 13 * seed) % 89) - 0.4f));
    }
    return rows;
  };
  const TargetFeatures a = rows_of(3, 1), b = rows_of(0, 2), c = rows_of(5, 3);
  std::vector<SeqId> together, alone;
  for (int i = 0; i < 3; ++i) together.push_back(d.lm->CreateSequence());
  for (int i = 0; i < 3; ++i) alone.push_back(d.lm->CreateSequence());
  ASSERT_TRUE(d.lm->AppendContext(alone[0], 0, a).ok());
  ASSERT_TRUE(d.lm->AppendContext(alone[1], 0, b).ok());
  ASSERT_TRUE(d.lm->AppendContext(alone[2], 0, c).ok());
  const std::vector<ContextRows> batch = {
      {together[0], 0, &a}, {together[1], 0, &b}, {together[2], 0, &c}};
  ASSERT_TRUE(d.lm->AppendContext(batch).ok());
  const int lens[] = {3, 0, 5};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    absl::StatusOr<std::vector<float>> want =
        d.lm->Forward({DflashBlock(d.config, alone[i], lens[i], 7, 4)});
    absl::StatusOr<std::vector<float>> got =
        d.lm->Forward({DflashBlock(d.config, together[i], lens[i], 7, 4)});
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(*got, *want);
    d.lm->Truncate(alone[i], lens[i]);
    d.lm->Truncate(together[i], lens[i]);
  }
  // A repeated sequence, or one bad entry: refused, naming the entry; nothing appended.
  const std::vector<ContextRows> twice = {{together[0], 3, &a}, {together[0], 6, &a}};
  absl::Status s = d.lm->AppendContext(twice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("entry 1"));
  const SeqId fresh = d.lm->CreateSequence();
  const std::vector<ContextRows> one_bad = {{fresh, 0, &a}, {together[1], 4, &a}};
  s = d.lm->AppendContext(one_bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("entry 1"));
  // `fresh` got no slots: a block after 3 context rows is past them.
  EXPECT_EQ(d.lm->Forward({DflashBlock(d.config, fresh, 3, 7, 4)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(d.lm->AppendContext(fresh, 0, a).ok());
  EXPECT_TRUE(d.lm->Forward({DflashBlock(d.config, fresh, 3, 7, 4)}).ok());
}

}  // namespace
}  // namespace treespec
