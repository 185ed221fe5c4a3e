// NCCL collectives against values computed on the host, on every GPU of the machine (one rank
// per GPU, one thread per rank); skips without a GPU.
#include "common/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/model/dtype.h"
#include "common/util/rank_threads.h"
#include "common/util/status_macros.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {

using testing::CudaTest;
class NcclCommunicatorTest : public CudaTest {};

TEST_F(NcclCommunicatorTest, RejectsBadDeviceLists) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  EXPECT_EQ(CreateNcclCommunicators({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicators({count}).status().code(), absl::StatusCode::kInvalidArgument);
  const auto twice = CreateNcclCommunicators({0, 0});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos);
}

TEST_F(NcclCommunicatorTest, SumsAndGathersOnEveryRank) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  for (int world = 1; world <= count; ++world) {
    std::vector<int> devices;
    for (int r = 0; r < world; ++r) devices.push_back(r);
    ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclCommunicators(devices));
    const int n = 1001;  // not a multiple of anything NCCL chunks by
    std::vector<std::vector<float>> sum_f32(world);
    std::vector<std::vector<uint16_t>> sum_bf16(world);
    std::vector<std::vector<int32_t>> gathered(world);
    std::vector<absl::Status> status(world);
    RankThreads threads(world);
    threads.Run([&](int r) {
      status[r] = [&]() -> absl::Status {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
        cudaStream_t stream;
        CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
        // Small integers: every summation order gives the same exact result.
        std::vector<float> f(n);
        std::vector<uint16_t> b(n);
        std::vector<int32_t> g(n);
        for (int e = 0; e < n; ++e) {
          f[e] = static_cast<float>((e % 17) * (r + 1) - 3 * r);
          b[e] = FloatToBf16Bits(static_cast<float>((e % 5) - r));
          g[e] = r * 100000 + e;
        }
        ASSIGN_OR_RETURN(auto df, DeviceBuffer<float>::Create(n));
        ASSIGN_OR_RETURN(auto db, DeviceBuffer<uint16_t>::Create(n));
        ASSIGN_OR_RETURN(auto dg, DeviceBuffer<int32_t>::Create(n));
        ASSIGN_OR_RETURN(auto dall, DeviceBuffer<int32_t>::Create(n * world));
        RETURN_IF_ERROR(df.CopyFromHost(f));
        RETURN_IF_ERROR(db.CopyFromHost(b));
        RETURN_IF_ERROR(dg.CopyFromHost(g));
        Communicator& c = *comms[r];
        RETURN_IF_ERROR(c.AllReduceSum(df.data(), n, CommType::kFloat32, stream));
        RETURN_IF_ERROR(c.AllReduceSum(db.data(), n, CommType::kBFloat16, stream));
        RETURN_IF_ERROR(c.AllGather(dg.data(), dall.data(), n, CommType::kInt32, stream));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        c.Barrier();
        sum_f32[r].resize(n);
        sum_bf16[r].resize(n);
        gathered[r].resize(n * world);
        RETURN_IF_ERROR(df.CopyToHost(absl::MakeSpan(sum_f32[r])));
        RETURN_IF_ERROR(db.CopyToHost(absl::MakeSpan(sum_bf16[r])));
        RETURN_IF_ERROR(dall.CopyToHost(absl::MakeSpan(gathered[r])));
        CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
        return absl::OkStatus();
      }();
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_OK(status[r]);
      EXPECT_EQ(comms[r]->rank(), r);
      EXPECT_EQ(comms[r]->world_size(), world);
      for (int e = 0; e < n; ++e) {
        float f = 0, b = 0;
        for (int q = 0; q < world; ++q) {
          f += static_cast<float>((e % 17) * (q + 1) - 3 * q);
          b += static_cast<float>((e % 5) - q);
        }
        ASSERT_EQ(sum_f32[r][e], f) << "world " << world << " rank " << r << " element " << e;
        ASSERT_EQ(Bf16BitsToFloat(sum_bf16[r][e]), b) << "world " << world << " rank " << r;
        for (int q = 0; q < world; ++q) ASSERT_EQ(gathered[r][q * n + e], q * 100000 + e);
      }
    }
  }
}

}  // namespace
}  // namespace treespec::gpu
