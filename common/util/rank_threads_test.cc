#include "common/util/rank_threads.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(RankThreadsTest, RunsEveryRankConcurrentlyRankZeroOnTheCaller) {
  for (int n : {1, 2, 5}) {
    RankThreads threads(n);
    EXPECT_EQ(threads.size(), n);
    for (int round = 0; round < 20; ++round) {
      std::vector<int> calls(n, 0);
      std::vector<std::thread::id> ids(n);
      // Every rank waits for all the others inside fn: this returns only if they run at once.
      std::mutex mu;
      std::condition_variable cv;
      int arrived = 0;
      threads.Run([&](int r) {
        ids[r] = std::this_thread::get_id();
        ++calls[r];
        std::unique_lock<std::mutex> lock(mu);
        if (++arrived == n) cv.notify_all();
        cv.wait(lock, [&] { return arrived == n; });
      });
      EXPECT_EQ(ids[0], std::this_thread::get_id());
      for (int r = 0; r < n; ++r) EXPECT_EQ(calls[r], 1) << "rank " << r << " round " << round;
      for (int r = 1; r < n; ++r) EXPECT_NE(ids[r], ids[0]);
    }
  }
}

TEST(RankThreadsTest, SameThreadPerRankAcrossRuns) {
  RankThreads threads(3);
  std::vector<std::thread::id> first(3), later(3);
  threads.Run([&](int r) { first[r] = std::this_thread::get_id(); });
  for (int i = 0; i < 5; ++i) threads.Run([&](int r) { later[r] = std::this_thread::get_id(); });
  EXPECT_EQ(first, later);
}

}  // namespace
}  // namespace treespec
