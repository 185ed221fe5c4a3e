// RAII device memory: one cudaMalloc'd array of T, freed on destruction. Movable, not copyable:
// host <-> device transfers are explicit calls, never copy constructors (STYLE, gemma.cpp).
// Allocate once up front (DESIGN: no per-step device allocation); these are not for hot paths.
#ifndef TREESPEC_COMMON_CUDA_DEVICE_BUFFER_H_
#define TREESPEC_COMMON_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"

namespace treespec::gpu {

template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "device buffers hold plain bytes");

 public:
  DeviceBuffer() = default;  // empty: data() == nullptr, size() == 0

  // `count` elements of uninitialised device memory on the current device (none for 0).
  static absl::StatusOr<DeviceBuffer> Create(size_t count) {
    DeviceBuffer buffer;
    if (count > 0) {
      void* ptr = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, count * sizeof(T)));
      buffer.data_ = static_cast<T*>(ptr);
      buffer.size_ = count;
    }
    return buffer;
  }

  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }  // elements
  size_t bytes() const { return size_ * sizeof(T); }

  // Blocking copies between `host` and the first host.size() elements of this buffer (ordered
  // after all prior work on the legacy default stream). host.size() must be <= size().
  // CopyFromHost returns when the data is on the device: cudaMemcpy from pageable memory may
  // return while its DMA is still running, and work on a non-blocking stream is not ordered
  // after it (a weight upload followed by a copy on the loader's stream could read half-written
  // rows), so it also waits for the legacy stream.
  absl::Status CopyFromHost(absl::Span<const T> host) {
    if (absl::Status fits = Fits(host.size()); !fits.ok()) return fits;
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(absl::Span<T> host) const {
    if (absl::Status fits = Fits(host.size()); !fits.ok()) return fits;
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

  // Stream-ordered copies; `host` must stay alive (and, for CopyToHostAsync, unread) until
  // the stream has reached them. Pinned host memory makes them truly asynchronous.
  absl::Status CopyFromHostAsync(absl::Span<const T> host, cudaStream_t stream) {
    if (absl::Status fits = Fits(host.size()); !fits.ok()) return fits;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data_, host.data(), host.size() * sizeof(T),
                                         cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
  absl::Status CopyToHostAsync(absl::Span<T> host, cudaStream_t stream) const {
    if (absl::Status fits = Fits(host.size()); !fits.ok()) return fits;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), data_, host.size() * sizeof(T),
                                         cudaMemcpyDeviceToHost, stream));
    return absl::OkStatus();
  }

  // Sets every byte to zero and returns when that is done, so that work on any stream, also a
  // non-blocking one, sees zeros (counters and flags that kernels expect zeroed).
  absl::Status ZeroNow() {
    if (size_ == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemset(data_, 0, bytes()));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
    return absl::OkStatus();
  }

  // Sets every byte of the buffer to `byte`, in stream order (tests poison outputs with 0xFF,
  // a NaN in fp32, fp16 and bf16).
  absl::Status FillBytes(unsigned char byte, cudaStream_t stream) {
    if (size_ == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data_, byte, bytes(), stream));
    return absl::OkStatus();
  }

 private:
  absl::Status Fits(size_t count) const {
    if (count <= size_) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("host span of ", count, " elements > device buffer of ", size_));
  }

  void Reset() {
    if (data_ != nullptr) cudaFree(data_);  // an error here has no one to report to
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;  // elements
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_DEVICE_BUFFER_H_
