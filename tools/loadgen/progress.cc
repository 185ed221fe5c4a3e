#include "tools/loadgen/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace treespec::loadgen {
namespace {

constexpr int kBarWidth = 30;

}  // namespace

ProgressBar::ProgressBar(std::string label, int total, bool enabled)
    : label_(std::move(label)), total_(total) {
  if (!enabled || isatty(STDERR_FILENO) == 0) return;
  thread_ = std::thread([this] {
    const absl::Time start = absl::Now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) {
      Draw();
      std::fprintf(stderr, "  %.1f s", absl::ToDoubleSeconds(absl::Now() - start));
    }
    Draw();
    std::fprintf(stderr, "  %.1f s\n", absl::ToDoubleSeconds(absl::Now() - start));
  });
}

ProgressBar::~ProgressBar() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressBar::Set(int done, int failed, int in_flight) {
  done_ = done;
  failed_ = failed;
  in_flight_ = in_flight;
}

void ProgressBar::Draw() {
  const int done = done_;
  const int filled = total_ > 0 ? std::min(kBarWidth, done * kBarWidth / total_) : kBarWidth;
  std::string bar(filled, '#');
  bar.resize(kBarWidth, '.');
  // \r: back to the line's start; \033[K: clear what a longer previous line left.
  std::fprintf(stderr, "\r\033[K%s [%s] %d/%d done, %d failed, %d in flight", label_.c_str(),
               bar.c_str(), done, total_, failed_.load(), in_flight_.load());
  std::fflush(stderr);
}

}  // namespace treespec::loadgen
