// Callbacks run at set times on one thread of their own (gRPC's callback API has no timers): the
// load harness cancels requests with it. A timer can be disarmed until its callback starts;
// Disarm says which of the two happened, so the caller knows whether the callback will run.
#ifndef TREESPEC_TOOLS_LOADGEN_TIMER_THREAD_H_
#define TREESPEC_TOOLS_LOADGEN_TIMER_THREAD_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace treespec::loadgen {

class TimerThread {
 public:
  using Clock = std::chrono::steady_clock;

  TimerThread();
  // Drops the timers that have not fired (their callbacks never run) and joins the thread.
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  // Runs `callback` on the timer thread at `when` (at once when that has passed); timers due at
  // the same time run in the order they were armed. Returns the timer's id for Disarm.
  uint64_t Arm(Clock::time_point when, std::function<void()> callback);

  // True when the timer was still waiting: it is removed and its callback never runs. False
  // when its callback has started (it may still be running) or the id is unknown.
  bool Disarm(uint64_t id);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  // Keyed by (due time, id): the earliest first, ties in arming order.
  std::map<std::pair<Clock::time_point, uint64_t>, std::function<void()>> timers_;
  std::map<uint64_t, Clock::time_point> due_;  // id -> due time, for Disarm
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_TIMER_THREAD_H_
