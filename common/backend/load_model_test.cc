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

}  // namespace
}  // namespace treespec
