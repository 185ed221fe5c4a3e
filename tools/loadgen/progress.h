// A one-line progress bar on stderr, redrawn a few times a second, shown only when stderr is a
// terminal (so logs and CI output stay clean).
#ifndef TREESPEC_TOOLS_LOADGEN_PROGRESS_H_
#define TREESPEC_TOOLS_LOADGEN_PROGRESS_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace treespec::loadgen {

class ProgressBar {
 public:
  // Shows `label` and progress towards `total` requests when `enabled` and stderr is a terminal;
  // otherwise does nothing.
  ProgressBar(std::string label, int total, bool enabled);
  ~ProgressBar();  // draws the final state and ends the line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Counts so far (any thread).
  void Set(int done, int failed, int in_flight);

 private:
  void Draw();

  const std::string label_;
  const int total_;
  std::atomic<int> done_{0}, failed_{0}, in_flight_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // runs only when shown
};

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_PROGRESS_H_
