// Collective operations between tensor-parallel ranks (DESIGN §6). The CPU implementation
// runs ranks as threads of one process; the NCCL one (issue 3) sits behind the same interface.
#ifndef TREESPEC_COMMON_MODEL_COMMUNICATOR_H_
#define TREESPEC_COMMON_MODEL_COMMUNICATOR_H_

#include <memory>

#include "absl/types/span.h"

namespace treespec {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over ranks. Every rank passes the same length. The sum is taken in rank
  // order (0, 1, ..., n-1) so the result is identical on every rank and run.
  virtual void AllReduceSum(absl::Span<float> data) = 0;
  // Gathers `send` (same length on every rank) into `recv` [world_size * send.size()],
  // rank-major.
  virtual void AllGather(absl::Span<const float> send, absl::Span<float> recv) = 0;
  virtual void Barrier() = 0;
};

// `world_size` communicators for threads of this process; element r is rank r's. Each must be
// used by exactly one thread.
std::vector<std::unique_ptr<Communicator>> CreateInProcessCommunicators(int world_size);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_COMMUNICATOR_H_
