// Runs one function per tensor-parallel rank, each rank on its own persistent thread (DESIGN
// §6): rank 0 on the caller's thread, ranks 1..n-1 on worker threads started once. Both
// backends drive their ranks with it: the CPU one computes on the threads, the CUDA one enqueues
// each GPU's work from its own thread (NCCL wants one thread per device).
#ifndef TREESPEC_COMMON_UTIL_RANK_THREADS_H_
#define TREESPEC_COMMON_UTIL_RANK_THREADS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace treespec {

class RankThreads {
 public:
  explicit RankThreads(int ranks);
  ~RankThreads();  // joins the workers (no Run may be in progress)
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return ranks_; }
  // Calls fn(r) for every rank r, concurrently, and returns when all have returned. One Run at
  // a time (callers serialise); fn must not throw.
  void Run(const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int rank);

  const int ranks_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // a new value means "run job_"
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_RANK_THREADS_H_
