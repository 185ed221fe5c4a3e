#include "common/model/communicator.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/model/dtype.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

// Runs fn(rank, comm) on one thread per rank.
template <typename Fn>
void RunRanks(int world, Fn fn) {
  auto comms = CreateInProcessCommunicators(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
}

TEST(InProcessCommunicatorTest, AllReduceSumsInRankOrderIdenticallyOnEveryRank) {
  for (int world : {1, 2, 3, 7}) {
    for (int size : {0, 1, 5, 64, 1001}) {
      // Inputs with very different magnitudes, so the summation order shows in the bits.
      std::vector<std::vector<float>> inputs(world);
      std::mt19937 rng(world * 1000 + size);
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (int r = 0; r < world; ++r) {
        for (int e = 0; e < size; ++e) inputs[r].push_back(d(rng) * (r % 2 ? 1e7f : 1.0f));
      }
      std::vector<float> expected(size);
      for (int e = 0; e < size; ++e) {
        float sum = inputs[0][e];
        for (int r = 1; r < world; ++r) sum += inputs[r][e];
        expected[e] = sum;
      }
      std::vector<std::vector<float>> results = inputs;
      RunRanks(world, [&](int r, Communicator& c) {
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.world_size(), world);
        for (int rep = 0; rep < 3; ++rep) {  // reuse across calls
          std::vector<float> data = inputs[r];
          c.AllReduceSum(absl::MakeSpan(data));
          if (rep == 2) results[r] = data;
        }
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(size == 0 ||
                    std::memcmp(results[r].data(), expected.data(), size * sizeof(float)) == 0)
            << "world " << world << " size " << size << " rank " << r;
      }
    }
  }
}

TEST(InProcessCommunicatorTest, AllGatherIsRankMajor) {
  const int world = 5, size = 3;
  std::vector<std::vector<float>> got(world);
  RunRanks(world, [&](int r, Communicator& c) {
    std::vector<float> send = {r * 10.0f, r * 10.0f + 1, r * 10.0f + 2};
    std::vector<float> recv(world * size, -1.0f);
    c.AllGather(send, absl::MakeSpan(recv));
    c.Barrier();
    std::vector<float> data = {static_cast<float>(r)};
    c.AllReduceSum(absl::MakeSpan(data));  // mixed collectives in sequence
    EXPECT_EQ(data[0], world * (world - 1) / 2.0f);
    got[r] = recv;
  });
  for (int r = 0; r < world; ++r) {
    for (int s = 0; s < world; ++s) {
      for (int e = 0; e < size; ++e) EXPECT_EQ(got[r][s * size + e], s * 10.0f + e);
    }
  }
}

TEST(InProcessCommunicatorTest, Bf16SumsInFp32AndRoundsOnce) {
  const int world = 3;
  // 256 + 1 + 1 in bf16 steps would round the ones away one at a time (256 + 1 = 257 is not a
  // bf16); summed in fp32 and rounded once it is 258, which is.
  const std::vector<float> values = {256.0f, 1.0f, 1.0f};
  std::vector<uint16_t> got(world);
  RunRanks(world, [&](int r, Communicator& c) {
    uint16_t data[2] = {FloatToBf16Bits(values[r]), FloatToBf16Bits(-0.5f * r)};
    ASSERT_TRUE(c.AllReduceSum(data, 2, CommType::kBFloat16, nullptr).ok());
    EXPECT_EQ(Bf16BitsToFloat(data[1]), -1.5f);
    got[r] = data[0];
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(Bf16BitsToFloat(got[r]), 258.0f) << "rank " << r;
}

TEST(InProcessCommunicatorTest, Int32SumAndGather) {
  const int world = 4;
  std::vector<std::vector<int32_t>> gathered(world);
  RunRanks(world, [&](int r, Communicator& c) {
    int32_t sum[3] = {r, -r, 1 << 20};
    ASSERT_TRUE(c.AllReduceSum(sum, 3, CommType::kInt32, nullptr).ok());
    EXPECT_EQ(sum[0], 6);
    EXPECT_EQ(sum[1], -6);
    EXPECT_EQ(sum[2], 4 << 20);
    const int32_t send[2] = {r, 100 + r};
    gathered[r].assign(2 * world, -1);
    ASSERT_TRUE(c.AllGather(send, gathered[r].data(), 2, CommType::kInt32, nullptr).ok());
  });
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q) {
      EXPECT_EQ(gathered[r][2 * q], q);
      EXPECT_EQ(gathered[r][2 * q + 1], 100 + q);
    }
  }
  EXPECT_EQ(CommTypeBytes(CommType::kBFloat16), 2u);
  EXPECT_EQ(CommTypeBytes(CommType::kInt32), 4u);
}

}  // namespace
}  // namespace treespec
