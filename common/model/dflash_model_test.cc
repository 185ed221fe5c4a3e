// The DFlash drafter on the CPU: its config.json and weights load (and bad ones are refused
// naming the field or tensor), and its block logits match PyTorch with Transformers' Qwen3
// modules (tools/dflash_reference.py) for context appended in chunks, as sessions append it.
#include "common/model/dflash_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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
  absl::StatusOr<DflashWeights> w =
      LoadDflashWeights(drafter, *c, Source("tests/data/models/qwen3_qknorm"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("was trained for a target of hidden 256, 6 layers, vocab 4096"));

  // A copy of the drafter with one more tensor than config.json describes.
  const std::string dir = ::testing::TempDir() + "/dflash_extra";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(drafter + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  DflashWeights weights;
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

TEST(DflashModelTest, BlockLogitsMatchPyTorch) {
  const Json ref = ReadJson(Source("tests/data/dflash_reference.json"));
  absl::StatusOr<std::unique_ptr<CpuDflashModel>> model =
      CpuDflashModel::Load(Source(ref["drafter"]), Source(ref["target"]));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int> probes = ref["probe_ids"].get<std::vector<int>>();
  const int width = (*model)->config().features().width();
  const int vocab = (*model)->config().body.vocab_size;
  double worst = 0;
  int blocks = 0;
  for (const Json& c : ref["cases"]) {
    DflashContext context;
    for (size_t step = 0; step < c["chunks"].size(); ++step) {
      TargetFeatures rows;
      for (const Json& row : c["chunks"][step]) {
        for (int bits : row) rows.bf16.push_back(static_cast<uint16_t>(bits));
        ++rows.rows;
      }
      rows.width = width;
      ASSERT_TRUE((*model)->Append(context, rows).ok());
      const Json& b = c["blocks"][step];
      absl::StatusOr<std::vector<float>> logits =
          (*model)->BlockLogits(context, b["bonus"].get<int>(), b["block"].get<int>());
      ASSERT_TRUE(logits.ok()) << logits.status();
      const int n = b["block"].get<int>() - 1;
      ASSERT_EQ(logits->size(), static_cast<size_t>(n) * vocab);
      for (int r = 0; r < n; ++r) {
        const float* row = logits->data() + static_cast<size_t>(r) * vocab;
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
  }
  EXPECT_EQ(blocks, 4);
  EXPECT_LT(worst, 1e-4) << "worst logit error of the row's scale";
  std::cerr << "DFlash block logits vs PyTorch: " << blocks << " blocks, worst error " << worst
            << " of the row's scale\n";
}

TEST(DflashModelTest, BadInputIsRefused) {
  absl::StatusOr<std::unique_ptr<CpuDflashModel>> model =
      CpuDflashModel::Load(Source("tests/data/models/dflash_random"), Source("models/tiny-target"));
  ASSERT_TRUE(model.ok()) << model.status();
  DflashContext context;
  TargetFeatures narrow{1, 256, std::vector<uint16_t>(256, 0)};
  EXPECT_THAT(std::string((*model)->Append(context, narrow).message()),
              HasSubstr("rows are 256 values wide; this drafter reads 512"));
  EXPECT_EQ((*model)->BlockLogits(context, 4096, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->BlockLogits(context, 5, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An empty context still drafts (the block attends to itself).
  EXPECT_TRUE((*model)->BlockLogits(context, 5, 4).ok());
}

}  // namespace
}  // namespace treespec
