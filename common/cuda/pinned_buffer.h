// RAII pinned (page-locked) host memory: the staging twin of a device buffer, so host-to-device
// copies run asynchronously on a stream. Allocate once up front, like DeviceBuffer.
#ifndef TREESPEC_COMMON_CUDA_PINNED_BUFFER_H_
#define TREESPEC_COMMON_CUDA_PINNED_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "common/cuda/cuda_check.h"

namespace treespec::gpu {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // `bytes` of pinned memory, zeroed (once; nothing of it is freed before the destructor).
  absl::Status Allocate(size_t bytes) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&data_, bytes));
    bytes_ = bytes;
    std::memset(data_, 0, bytes);
    return absl::OkStatus();
  }
  // At least `bytes`, keeping what the buffer holds: a larger one replaces it only when it is
  // too small, so a buffer sized by the largest use so far stops allocating.
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    void* grown = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&grown, bytes));
    std::memset(grown, 0, bytes);
    if (data_ != nullptr) {
      std::memcpy(grown, data_, bytes_);
      cudaFreeHost(data_);
    }
    data_ = grown;
    bytes_ = bytes;
    return absl::OkStatus();
  }
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }
  int32_t* ints() const { return static_cast<int32_t*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_PINNED_BUFFER_H_
