// --device resolution: explicit cpu, auto (CPU on a machine without a GPU, and with more ranks
// than GPUs), GPU lists, and clear errors for unknown values or CUDA where there is none.
#include "common/backend/load_model.h"

#include <string>

#include "common/model/causal_lm.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(LoadModelTest, CpuAndAutoResolve) {
  LmOptions options;
  EXPECT_EQ(*ResolveDevice("cpu", options), "cpu");
  const absl::StatusOr<std::string> automatic = ResolveDevice("auto", options);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(*automatic == "cpu" || *automatic == "cuda:0") << *automatic;
  options.tensor_parallel = 64;  // more ranks than any machine here has GPUs
  EXPECT_EQ(*ResolveDevice("auto", options), "cpu");
}

TEST(LoadModelTest, BadDevicesNameTheFlag) {
  LmOptions options;
  for (const std::string bad : {"tpu", "cuda:x", "gpu", "cuda:0,", "cuda:-1"}) {
    const absl::StatusOr<std::string> r = ResolveDevice(bad, options);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--device=" + bad), std::string::npos) << r.status();
  }
  // Without a GPU (this CI machine) an explicit CUDA device is refused with a reason.
  const absl::StatusOr<std::string> cuda = ResolveDevice("cuda", options);
  if (!cuda.ok()) {
    EXPECT_NE(cuda.status().message().find("--device=cuda"), std::string::npos) << cuda.status();
  }
}

TEST(LoadModelTest, GpuListsMatchTheRanks) {
  LmOptions options;
  options.tensor_parallel = 2;
  const absl::StatusOr<std::string> one = ResolveDevice("cuda:0,1,2", options);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  // Where two GPUs are present, "cuda" and "cuda:0" with --tp=2 both mean GPUs 0 and 1.
  const absl::StatusOr<std::string> two = ResolveDevice("cuda", options);
  if (two.ok()) {
    EXPECT_EQ(*two, "cuda:0,1");
    EXPECT_EQ(*ResolveDevice("cuda:0", options), "cuda:0,1");
    EXPECT_EQ(*ResolveDevice("cuda:1,0", options), "cuda:1,0");
  } else {
    EXPECT_NE(two.status().message().find("--device=cuda"), std::string::npos) << two.status();
  }
}

TEST(LoadModelTest, LoadsTheTinyTargetOnTheResolvedBackend) {
  LmOptions options;
  options.max_batch = 2;
  auto model =
      LoadCausalLm(std::string(TREESPEC_SOURCE_DIR) + "/models/tiny-target", "auto", options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*ResolveDevice("auto", options), (*model)->device() == "cpu" ? "cpu" : "cuda:0");
}

// Random weights are made on a GPU: the CPU refuses them, naming the alternative; on a GPU the
// model has the directory's shape (only config.json is read).
TEST(LoadModelTest, RandomWeightsTakeTheConfigsShapeOnAGpu) {
  LmOptions options;
  options.max_batch = 2;
  const std::string dir = std::string(TREESPEC_SOURCE_DIR) + "/models/tiny-target";
  // The benchmark shape (models/README.md) is a config the loader takes.
  absl::StatusOr<ModelConfig> shape =
      LoadModelConfig(std::string(TREESPEC_SOURCE_DIR) + "/models/llama3-8b-shape");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_layers, 32);
  EXPECT_EQ(shape->vocab_size, 128256);
  auto cpu = CreateRandomCausalLm(dir, "cpu", options, 1);
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("treespec-random-model"), std::string::npos);
  if (*ResolveDevice("auto", options) == "cpu") GTEST_SKIP() << "no GPU here";
  auto gpu = CreateRandomCausalLm(dir, "auto", options, 1);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CausalLm& lm = **gpu;
  EXPECT_EQ(lm.config().num_layers, LoadModelConfig(dir)->num_layers);
  // Decisive weights: greedy decoding repeats the last token, after a prompt and along a
  // drafted chain of it alike.
  const SeqId seq = lm.CreateSequence();
  SeqTree prompt{seq, 0, {5, 17, 99}, {-1, 0, 1}};
  StepSpec prefill;
  prefill.prefill = true;
  absl::StatusOr<std::vector<StepResult>> first = lm.VerifyStep({prompt}, {prefill});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)[0].emitted.back(), 99);
  SeqTree chain{seq, 3, {99, 99, 99, 99}, {-1, 0, 1, 2}};
  absl::StatusOr<std::vector<StepResult>> next = lm.VerifyStep({chain}, {StepSpec{}});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].emitted, std::vector<int32_t>(4, 99));
  lm.FreeSequence(seq);
  EXPECT_FALSE(CreateRandomCausalLm("/nonexistent", "auto", options, 1).ok());
}

}  // namespace
}  // namespace treespec
