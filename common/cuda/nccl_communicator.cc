#include "common/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace treespec::gpu {
namespace {

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(result), " (", ncclGetLastError(nullptr),
                   ")"));
}

ncclDataType_t NcclType(CommType type) {
  switch (type) {
    case CommType::kFloat32:
      return ncclFloat32;
    case CommType::kBFloat16:
      return ncclBfloat16;
    case CommType::kInt32:
      return ncclInt32;
  }
  return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int world_size)
      : comm_(comm), device_(device), rank_(rank), world_size_(world_size) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (barrier_stream_ != nullptr) cudaStreamDestroy(barrier_stream_);
    barrier_word_ = DeviceBuffer<int32_t>();
    ncclCommDestroy(comm_);
  }

  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&barrier_stream_, cudaStreamNonBlocking));
    ASSIGN_OR_RETURN(barrier_word_, DeviceBuffer<int32_t>::Create(1));
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(void* data, size_t count, CommType type, void* stream) override {
    if (count == 0) return absl::OkStatus();
    return NcclStatus(ncclAllReduce(data, data, count, NcclType(type), ncclSum, comm_,
                                    static_cast<cudaStream_t>(stream)),
                      "all-reduce");
  }

  absl::Status AllGather(const void* send, void* recv, size_t count, CommType type,
                         void* stream) override {
    if (count == 0) return absl::OkStatus();
    return NcclStatus(ncclAllGather(send, recv, count, NcclType(type), comm_,
                                    static_cast<cudaStream_t>(stream)),
                      "all-gather");
  }

  // A one-word all-reduce on a private stream, waited for.
  void Barrier() override {
    absl::Status s = AllReduceSum(barrier_word_.data(), 1, CommType::kInt32, barrier_stream_);
    if (s.ok()) {
      if (cudaError_t e = cudaStreamSynchronize(barrier_stream_); e != cudaSuccess) {
        s = absl::InternalError(cudaGetErrorString(e));
      }
    }
    if (!s.ok()) Fatal(absl::StrCat("NcclCommunicator::Barrier: ", s.ToString()));
  }

 private:
  ncclComm_t comm_;
  const int device_, rank_, world_size_;
  cudaStream_t barrier_stream_ = nullptr;
  DeviceBuffer<int32_t> barrier_word_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(
    absl::Span<const int> devices) {
  const int n = static_cast<int>(devices.size());
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (n == 0) return absl::InvalidArgumentError("NCCL: no devices given");
  for (int r = 0; r < n; ++r) {
    if (devices[r] < 0 || devices[r] >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL: device ", devices[r], " not in [0, ", count, ")"));
    }
    if (std::count(devices.begin(), devices.end(), devices[r]) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL: device ", devices[r], " is listed twice (one tensor-parallel rank per GPU)"));
    }
  }
  std::vector<ncclComm_t> comms(n);
  RETURN_IF_ERROR(NcclStatus(ncclCommInitAll(comms.data(), n, devices.data()), "init"));
  std::vector<std::unique_ptr<NcclCommunicator>> owned;  // each destroys its comm
  for (int r = 0; r < n; ++r) {
    owned.push_back(std::make_unique<NcclCommunicator>(comms[r], devices[r], r, n));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& comm : owned) {
    RETURN_IF_ERROR(comm->Init());
    out.push_back(std::move(comm));
  }
  return out;
}

}  // namespace treespec::gpu
