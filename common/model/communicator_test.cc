#include "common/model/communicator.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace treespec
