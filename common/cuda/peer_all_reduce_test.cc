// The peer all-reduce + residual + RMSNorm kernel on every GPU of the machine (2+; skips
// otherwise) against the unfused path on one GPU: the rank-order fp32 sum of the partials,
// rounded to bf16, then LaunchRmsNorm with it as the residual — bit for bit, on every rank.
// A sequence of calls with changing row counts (more rows than blocks, a call with no rows)
// checks the barriers, the epochs and the double-buffered mailboxes.
#include "common/cuda/peer_all_reduce.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/rms_norm.h"
#include "common/util/rank_threads.h"
#include "common/util/status_macros.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {

using bf16 = __nv_bfloat16;
using testing::Bits;
using testing::FromBits;
using testing::RandomBf16;

class PeerAllReduceTest : public testing::CudaTest {};

struct Call {
  int rows, n;
  bool add_residual;
};

TEST_F(PeerAllReduceTest, EqualsSumThenRmsNormOnEveryRank) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  for (int world = 2; world <= std::min(count, 8); ++world) {
    std::vector<int> devices;
    for (int r = 0; r < world; ++r) devices.push_back(r);
    constexpr int kMaxRows = 300;
    constexpr int kMaxN = 4096;
    ASSERT_OK_AND_ASSIGN(auto group, PeerReduceGroup::Create(devices, kMaxRows * kMaxN));
    if (group == nullptr) GTEST_SKIP() << "no peer access between these GPUs";
    const std::vector<Call> calls = {{1, 4096, false}, {3, 4096, true},  {200, 4096, true},
                                     {0, 4096, true},  {17, 4096, true}, {300, 100, true},
                                     {128, 4096, false}, {5, 104, true}};
    uint64_t epoch = 0;
    for (const Call& call : calls) {
      ++epoch;
      SCOPED_TRACE(absl::StrCat("world ", world, " epoch ", epoch, " rows ", call.rows, " n ",
                                call.n, call.add_residual ? " +residual" : ""));
      const size_t elems = static_cast<size_t>(call.rows) * call.n;
      const auto x0 = RandomBf16(rng_, elems, 4.0f);
      const auto weight = RandomBf16(rng_, call.n, 1.5f);
      std::vector<testing::Bf16Data> partial;
      for (int r = 0; r < world; ++r) partial.push_back(RandomBf16(rng_, elems, 2.0f));
      // The rank-order sum, rounded once.
      std::vector<bf16> sum(elems);
      for (size_t i = 0; i < elems; ++i) {
        float s = 0.0f;
        for (int r = 0; r < world; ++r) s += partial[r].f[i];
        sum[i] = FromBits(FloatToBf16Bits(s));
      }
      std::vector<std::vector<bf16>> got_x(world, std::vector<bf16>(elems)),
          got_out(world, std::vector<bf16>(elems));
      std::vector<absl::Status> status(world);
      RankThreads threads(world);
      threads.Run([&](int r) {
        status[r] = [&]() -> absl::Status {
          CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
          cudaStream_t stream;
          CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(std::max<size_t>(elems, 1)));
          ASSIGN_OR_RETURN(auto out, DeviceBuffer<bf16>::Create(std::max<size_t>(elems, 1)));
          ASSIGN_OR_RETURN(auto w, DeviceBuffer<bf16>::Create(call.n));
          RETURN_IF_ERROR(x.CopyFromHost(x0.bf));
          RETURN_IF_ERROR(w.CopyFromHost(weight.bf));
          RETURN_IF_ERROR(out.FillBytes(0xFF, stream));
          CUDA_RETURN_IF_ERROR(cudaMemcpy(group->mailbox(r, epoch), partial[r].bf.data(),
                                          elems * sizeof(bf16), cudaMemcpyHostToDevice));
          CUDA_RETURN_IF_ERROR(group->Launch(r, epoch, call.rows, x.data(), call.add_residual,
                                             w.data(), call.n, 1e-5f, out.data(), stream));
          CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
          RETURN_IF_ERROR(x.CopyToHost(absl::MakeSpan(got_x[r])));
          RETURN_IF_ERROR(out.CopyToHost(absl::MakeSpan(got_out[r])));
          CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
          return absl::OkStatus();
        }();
      });
      for (int r = 0; r < world; ++r) ASSERT_OK(status[r]);
      if (elems == 0) continue;
      // The unfused reference on GPU 0.
      ASSERT_CUDA(cudaSetDevice(0));
      ASSERT_OK_AND_ASSIGN(auto ref_x, Upload(call.add_residual ? x0.bf : sum));
      ASSERT_OK_AND_ASSIGN(auto ref_sum, Upload(sum));
      ASSERT_OK_AND_ASSIGN(auto ref_w, Upload(weight.bf));
      ASSERT_OK_AND_ASSIGN(auto ref_out, Poisoned(elems));
      ASSERT_CUDA(LaunchRmsNorm(ref_x.data(), call.add_residual ? ref_sum.data() : nullptr,
                                ref_w.data(), call.rows, call.n, 1e-5f, ref_out.data(), stream_));
      ASSERT_OK_AND_ASSIGN(auto want_x, Download(ref_x));
      ASSERT_OK_AND_ASSIGN(auto want_out, Download(ref_out));
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < elems; ++i) {
          ASSERT_EQ(Bits(got_x[r][i]), Bits(want_x[i])) << "rank " << r << " x element " << i;
          ASSERT_EQ(Bits(got_out[r][i]), Bits(want_out[i])) << "rank " << r << " out " << i;
        }
      }
    }
  }
}

TEST_F(PeerAllReduceTest, BadLaunchesAreRefused) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  ASSERT_OK_AND_ASSIGN(auto group, PeerReduceGroup::Create({0, 1}, 1024));
  if (group == nullptr) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  ASSERT_OK_AND_ASSIGN(auto x, DeviceBuffer<bf16>::Create(2048));
  // More rows than the mailbox holds, epoch 0, a rank out of range: nothing is launched (a
  // launch would wait for a peer that never comes).
  EXPECT_EQ(group->Launch(0, 1, 2, x.data(), true, x.data(), 1024, 1e-5f, x.data(), stream_),
            cudaErrorInvalidValue);
  EXPECT_EQ(group->Launch(0, 0, 1, x.data(), true, x.data(), 64, 1e-5f, x.data(), stream_),
            cudaErrorInvalidValue);
  EXPECT_EQ(group->Launch(2, 1, 1, x.data(), true, x.data(), 64, 1e-5f, x.data(), stream_),
            cudaErrorInvalidValue);
  ASSERT_OK_AND_ASSIGN(auto one, PeerReduceGroup::Create({0}, 1024));
  EXPECT_EQ(one, nullptr);
}

}  // namespace
}  // namespace treespec::gpu
