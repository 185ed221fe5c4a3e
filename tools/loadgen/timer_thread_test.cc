// The timer thread: callbacks run no sooner than due and in due order, a disarmed timer never
// runs and Disarm says so, a callback may arm another, and pending timers die with the thread.
#include "tools/loadgen/timer_thread.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::ElementsAre;
using Clock = TimerThread::Clock;
using std::chrono::milliseconds;

// Waits (up to 10 s, for a loaded machine) until `done` holds.
template <typename F>
bool WaitFor(F done) {
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(TimerThreadTest, RunsInDueOrderNoSoonerThanDue) {
  TimerThread timers;
  std::mutex mu;
  std::vector<int> order;
  std::vector<Clock::time_point> ran(3);
  const Clock::time_point start = Clock::now();
  const Clock::time_point due[3] = {start + milliseconds(60), start + milliseconds(20),
                                    start + milliseconds(40)};
  for (int i = 0; i < 3; ++i) {
    timers.Arm(due[i], [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      ran[i] = Clock::now();
      order.push_back(i);
    });
  }
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size() == 3;
  }));
  EXPECT_THAT(order, ElementsAre(1, 2, 0));
  for (int i = 0; i < 3; ++i) EXPECT_GE(ran[i], due[i]) << i;
}

TEST(TimerThreadTest, SameDueTimeRunsInArmingOrderAndPastTimesRunAtOnce) {
  TimerThread timers;
  std::mutex mu;
  std::vector<int> order;
  const Clock::time_point past = Clock::now() - milliseconds(5);
  for (int i = 0; i < 4; ++i) {
    timers.Arm(past, [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size() == 4;
  }));
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3));
}

TEST(TimerThreadTest, DisarmBeforeDueStopsTheCallback) {
  TimerThread timers;
  std::atomic<int> runs{0};
  // Due long after the test (so a loaded machine cannot let it fire first), and due soon.
  const uint64_t late = timers.Arm(Clock::now() + std::chrono::seconds(30), [&] { ++runs; });
  const uint64_t soon = timers.Arm(Clock::now() + milliseconds(20), [&] { runs += 10; });
  EXPECT_TRUE(timers.Disarm(late));
  EXPECT_FALSE(timers.Disarm(late));  // already gone
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 10; }));
  EXPECT_FALSE(timers.Disarm(soon));   // it ran
  EXPECT_FALSE(timers.Disarm(12345));  // never armed
  EXPECT_EQ(runs.load(), 10);
}

TEST(TimerThreadTest, ACallbackMayArmAnother) {
  TimerThread timers;
  std::atomic<bool> second{false};
  timers.Arm(Clock::now(), [&] { timers.Arm(Clock::now(), [&] { second = true; }); });
  EXPECT_TRUE(WaitFor([&] { return second.load(); }));
}

TEST(TimerThreadTest, PendingTimersDieWithTheThread) {
  std::atomic<int> runs{0};
  {
    TimerThread timers;
    timers.Arm(Clock::now() + std::chrono::hours(1), [&] { ++runs; });
  }  // must not wait an hour
  EXPECT_EQ(runs.load(), 0);
}

}  // namespace
}  // namespace treespec::loadgen
