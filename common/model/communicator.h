// Collective operations between tensor-parallel ranks (DESIGN §6). Two implementations sit
// behind this one interface: the in-process one (CPU backend: ranks are threads of one process,
// buffers are host memory) and NCCL (common/cuda/nccl_communicator.h: buffers are device memory
// of the rank's GPU, work is enqueued on a CUDA stream).
#ifndef TREESPEC_COMMON_MODEL_COMMUNICATOR_H_
#define TREESPEC_COMMON_MODEL_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace treespec {

// Element types of a collective.
enum class CommType { kFloat32, kBFloat16, kInt32 };
size_t CommTypeBytes(CommType type);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In-place sum over ranks of `count` elements at `data`; every rank passes the same count
  // and type. `stream` is the cudaStream_t the work is enqueued on for a device communicator
  // (the call returns once it is enqueued) and is ignored by the in-process one (which returns
  // when the sum is done). The in-process sum runs in rank order (0, 1, ..., n-1), bf16 in fp32
  // rounded once, so the result is identical on every rank and run. NCCL's order is its own
  // (identical on every rank of a group; bf16 partial sums may be rounded between ring steps).
  virtual absl::Status AllReduceSum(void* data, size_t count, CommType type, void* stream) = 0;
  // Gathers `count` elements of `send` from every rank into `recv` [world_size * count],
  // rank-major. Same memory and stream rules as AllReduceSum.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, CommType type,
                                 void* stream) = 0;
  // Returns when every rank has called Barrier (and, for a device communicator, when the work
  // enqueued before it on this communicator is done).
  virtual void Barrier() = 0;

  // Host fp32 forms for the CPU backend (in-process communicators). A failure is a programming
  // error there and ends the process with a message.
  void AllReduceSum(absl::Span<float> data);
  void AllGather(absl::Span<const float> send, absl::Span<float> recv);
};

// `world_size` communicators for threads of this process; element r is rank r's. Each must be
// used by exactly one thread.
std::vector<std::unique_ptr<Communicator>> CreateInProcessCommunicators(int world_size);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_COMMUNICATOR_H_
