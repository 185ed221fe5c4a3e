#include "common/model/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/dtype.h"
#include "common/util/log.h"

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
  std::vector<const void*> inputs;                  // [world] each rank's buffer of this collective
  std::vector<std::vector<unsigned char>> partial;  // [world] rank r's reduced chunk
};

// Elements [begin, end) of the sum over `inputs` in rank order, written to `out`.
template <typename T>
void SumRange(const std::vector<const void*>& inputs, size_t begin, size_t end, void* out) {
  T* o = static_cast<T*>(out);
  for (size_t e = begin; e < end; ++e) {
    T sum = static_cast<const T*>(inputs[0])[e];
    for (size_t r = 1; r < inputs.size(); ++r) sum += static_cast<const T*>(inputs[r])[e];
    o[e - begin] = sum;
  }
}

void SumRangeBf16(const std::vector<const void*>& inputs, size_t begin, size_t end, void* out) {
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t e = begin; e < end; ++e) {
    float sum = Bf16BitsToFloat(static_cast<const uint16_t*>(inputs[0])[e]);
    for (size_t r = 1; r < inputs.size(); ++r) {
      sum += Bf16BitsToFloat(static_cast<const uint16_t*>(inputs[r])[e]);
    }
    o[e - begin] = FloatToBf16Bits(sum);
  }
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank, int world_size)
      : shared_(std::move(shared)), rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  // Reduce-scatter then all-gather: rank r sums chunk r over ranks 0..n-1 in rank order into
  // its own `partial`, then every rank copies all chunks. Each element is summed by exactly one
  // rank in the fixed order, so every rank receives the same bits.
  absl::Status AllReduceSum(void* data, size_t size, CommType type, void*) override {
    if (world_size_ == 1) return absl::OkStatus();
    const size_t elem = CommTypeBytes(type);
    const size_t chunk = (size + world_size_ - 1) / world_size_;
    shared_->inputs[rank_] = data;
    shared_->barrier.Wait();  // every input is published

    const size_t begin = std::min(size, chunk * rank_);
    const size_t end = std::min(size, begin + chunk);
    std::vector<unsigned char>& mine = shared_->partial[rank_];
    mine.resize((end - begin) * elem);
    switch (type) {
      case CommType::kFloat32:
        SumRange<float>(shared_->inputs, begin, end, mine.data());
        break;
      case CommType::kInt32:
        SumRange<int32_t>(shared_->inputs, begin, end, mine.data());
        break;
      case CommType::kBFloat16:
        SumRangeBf16(shared_->inputs, begin, end, mine.data());
        break;
    }
    shared_->barrier.Wait();  // every chunk is reduced; nobody reads the inputs any more

    for (int r = 0; r < world_size_; ++r) {
      const size_t b = std::min(size, chunk * r);
      const size_t len = std::min(size, b + chunk) - b;
      if (len > 0) {
        std::memcpy(static_cast<unsigned char*>(data) + b * elem, shared_->partial[r].data(),
                    len * elem);
      }
    }
    // The next collective's first barrier keeps `partial` alive until everyone has copied.
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, void* recv, size_t size, CommType type,
                         void*) override {
    const size_t bytes = size * CommTypeBytes(type);
    if (world_size_ == 1) {
      if (bytes > 0) std::memmove(recv, send, bytes);
      return absl::OkStatus();
    }
    shared_->inputs[rank_] = send;
    shared_->barrier.Wait();
    for (int r = 0; r < world_size_; ++r) {
      if (bytes > 0) {
        std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, shared_->inputs[r], bytes);
      }
    }
    shared_->barrier.Wait();  // senders may reuse their buffers only after everyone copied
    return absl::OkStatus();
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

size_t CommTypeBytes(CommType type) {
  switch (type) {
    case CommType::kFloat32:
    case CommType::kInt32:
      return 4;
    case CommType::kBFloat16:
      return 2;
  }
  return 0;
}

void Communicator::AllReduceSum(absl::Span<float> data) {
  const absl::Status s = AllReduceSum(data.data(), data.size(), CommType::kFloat32, nullptr);
  if (!s.ok()) Fatal(absl::StrCat("Communicator::AllReduceSum: ", s.ToString()));
}

void Communicator::AllGather(absl::Span<const float> send, absl::Span<float> recv) {
  if (recv.size() != send.size() * static_cast<size_t>(world_size())) {
    Fatal(absl::StrCat("Communicator::AllGather: recv holds ", recv.size(), " floats, want ",
                       send.size() * world_size()));
  }
  const absl::Status s =
      AllGather(send.data(), recv.data(), send.size(), CommType::kFloat32, nullptr);
  if (!s.ok()) Fatal(absl::StrCat("Communicator::AllGather: ", s.ToString()));
}

std::vector<std::unique_ptr<Communicator>> CreateInProcessCommunicators(int world_size) {
  auto shared = std::make_shared<Shared>(world_size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) {
    out.push_back(std::make_unique<InProcessCommunicator>(shared, r, world_size));
  }
  return out;
}

}  // namespace treespec
