// The Drafter gRPC service (DESIGN §2): one bidi stream per request. The first message opens a
// session (prompt, mode, limits); every Commit appends tokens and is answered by the DraftTree
// for its step. Proto types stop here; drafters see only DraftSession.
//
// Drafting runs on a WorkerPool, never on gRPC's callback threads; each session's work is
// serial (at most one task of a session queued or running), so sessions take turns.
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "drafter_service/drafter.h"
#include "drafter_service/drafter_metrics.h"
#include "drafter_service/worker_pool.h"
#include "treespec/v1/drafter.grpc.pb.h"

namespace treespec {

enum class DrafterKind { kNgram, kDraftModel };

struct DrafterServiceOptions {
  DrafterKind default_kind = DrafterKind::kNgram;  // what SPECULATION_MODE_AUTO gets
  int default_tree_budget = 16;                    // for tree_budget = 0
  int default_max_depth = 8;                       // for max_depth = 0
  int max_tree_budget = 256;                       // larger requests are INVALID_ARGUMENT
  int max_depth_limit = 64;                        // larger requests are INVALID_ARGUMENT
  int vocab_size = 0;      // token ids must be in [0, vocab_size); 0 = only >= 0
  int worker_threads = 2;  // drafting threads
};

// Checks that the options are consistent with the drafters given (the message names the
// option), e.g. the default kind has a drafter and defaults are within the maxima.
absl::Status ValidateDrafterServiceOptions(const DrafterServiceOptions& options, bool have_ngram,
                                           bool have_draft_model);

class DrafterService final : public v1::Drafter::CallbackService {
 public:
  // `draft_model` may be null (ngram only). The factories must be thread-safe. `metrics` (may
  // be null) must outlive the service.
  DrafterService(const DrafterServiceOptions& options, std::unique_ptr<DrafterFactory> ngram,
                 std::unique_ptr<DrafterFactory> draft_model, DrafterMetrics* metrics = nullptr);
  // Shut the grpc::Server down first: it waits for every stream to end.
  ~DrafterService() override;

  grpc::ServerBidiReactor<v1::DraftRequest, v1::DraftResponse>* Draft(
      grpc::CallbackServerContext* context) override;

  int active_sessions() const { return active_sessions_.load(); }
  int64_t total_sessions() const { return total_sessions_.load(); }

 private:
  class SessionReactor;

  const DrafterServiceOptions options_;
  const std::unique_ptr<DrafterFactory> ngram_;
  const std::unique_ptr<DrafterFactory> draft_model_;
  DrafterMetrics* const metrics_;  // may be null
  std::atomic<int> active_sessions_{0};
  std::atomic<int64_t> total_sessions_{0};
  WorkerPool pool_;  // last: its threads stop before the factories go
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
