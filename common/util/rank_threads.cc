#include "common/util/rank_threads.h"

namespace treespec {

RankThreads::RankThreads(int ranks) : ranks_(ranks < 1 ? 1 : ranks) {
  for (int r = 1; r < ranks_; ++r) workers_.emplace_back([this, r] { WorkerLoop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void RankThreads::Run(const std::function<void(int)>& fn) {
  if (ranks_ > 1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      pending_ = ranks_ - 1;
      ++generation_;
    }
    start_cv_.notify_all();
  }
  fn(0);
  if (ranks_ > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }
}

void RankThreads::WorkerLoop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(rank);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace treespec
