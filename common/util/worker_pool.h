// A fixed pool of threads running submitted tasks in FIFO order, so gRPC's callback threads
// (which also answer health checks) only move messages: the drafter drafts here (each session
// keeping at most one task queued, so sessions take turns), the verifier tokenizes and admits
// requests here.
#ifndef TREESPEC_COMMON_UTIL_WORKER_POOL_H_
#define TREESPEC_COMMON_UTIL_WORKER_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace treespec {

class WorkerPool {
 public:
  explicit WorkerPool(int num_threads);
  // Runs the tasks already queued, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> task);
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_WORKER_POOL_H_
