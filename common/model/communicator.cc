#include "common/model/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace treespec {
namespace {

// A reusable barrier for `count` threads (mutex + condition variable: on a machine with fewer
// cores than ranks, spinning would starve the rank everybody waits for).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  const int count_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// What the ranks of one group share. Each rank writes only its own entries; the barriers order
// the reads after the writes.
struct Shared {
  explicit Shared(int n) : barrier(n), inputs(n), partial(n) {}
  Barrier barrier;
  std::vector<const float*> inputs;         // [world] each rank's buffer of this collective
  std::vector<std::vector<float>> partial;  // [world] rank r's reduced chunk
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank, int world_size)
      : shared_(std::move(shared)), rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  // Reduce-scatter then all-gather: rank r sums chunk r over ranks 0..n-1 in rank order into
  // its own `partial`, then every rank copies all chunks. Each element is summed by exactly one
  // rank in the fixed order, so every rank receives the same bits.
  void AllReduceSum(absl::Span<float> data) override {
    if (world_size_ == 1) return;
    const size_t size = data.size();
    const size_t chunk = (size + world_size_ - 1) / world_size_;
    shared_->inputs[rank_] = data.data();
    shared_->barrier.Wait();  // every input is published

    const size_t begin = std::min(size, chunk * rank_);
    const size_t end = std::min(size, begin + chunk);
    std::vector<float>& mine = shared_->partial[rank_];
    mine.resize(end - begin);
    for (size_t e = begin; e < end; ++e) {
      float sum = shared_->inputs[0][e];
      for (int r = 1; r < world_size_; ++r) sum += shared_->inputs[r][e];
      mine[e - begin] = sum;
    }
    shared_->barrier.Wait();  // every chunk is reduced; nobody reads the inputs any more

    for (int r = 0; r < world_size_; ++r) {
      const size_t b = std::min(size, chunk * r);
      const size_t len = std::min(size, b + chunk) - b;
      if (len > 0) std::memcpy(data.data() + b, shared_->partial[r].data(), len * sizeof(float));
    }
    // The next collective's first barrier keeps `partial` alive until everyone has copied.
  }

  void AllGather(absl::Span<const float> send, absl::Span<float> recv) override {
    const size_t size = send.size();
    if (world_size_ == 1) {
      std::copy(send.begin(), send.end(), recv.begin());
      return;
    }
    shared_->inputs[rank_] = send.data();
    shared_->barrier.Wait();
    for (int r = 0; r < world_size_; ++r) {
      if (size > 0) std::memcpy(recv.data() + r * size, shared_->inputs[r], size * sizeof(float));
    }
    shared_->barrier.Wait();  // senders may reuse their buffers only after everyone copied
  }

  void Barrier() override {
    if (world_size_ > 1) shared_->barrier.Wait();
  }

 private:
  std::shared_ptr<Shared> shared_;
  const int rank_;
  const int world_size_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateInProcessCommunicators(int world_size) {
  auto shared = std::make_shared<Shared>(world_size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) {
    out.push_back(std::make_unique<InProcessCommunicator>(shared, r, world_size));
  }
  return out;
}

}  // namespace treespec
