#include "tools/loadgen/timer_thread.h"

namespace treespec::loadgen {

TimerThread::TimerThread() : thread_([this] { Loop(); }) {}

TimerThread::~TimerThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t TimerThread::Arm(Clock::time_point when, std::function<void()> callback) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    timers_.emplace(std::make_pair(when, id), std::move(callback));
    due_.emplace(id, when);
  }
  cv_.notify_all();
  return id;
}

bool TimerThread::Disarm(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = due_.find(id);
  if (it == due_.end()) return false;
  timers_.erase(std::make_pair(it->second, id));
  due_.erase(it);
  return true;
}

void TimerThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (timers_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto first = timers_.begin();
    // A copy: the wait lets go of the lock, and Disarm may erase the node meanwhile.
    const Clock::time_point due = first->first.first;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;  // due, woken early, or the timers changed: look again
    }
    std::function<void()> callback = std::move(first->second);
    due_.erase(first->first.second);
    timers_.erase(first);
    // Outside the lock: the callback may arm or disarm timers.
    lock.unlock();
    callback();
    lock.lock();
  }
}

}  // namespace treespec::loadgen
