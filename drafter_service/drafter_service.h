// The Drafter gRPC service (DESIGN §2): one bidi stream per request. The first message opens a
// session (prompt, mode, limits), answered by DraftOpened (the limits the session runs under:
// the asked ones clamped to this drafter's maxima); every Commit appends tokens and is answered
// by the DraftTree for its step. GetInfo states the drafter's limits and kinds. Proto types
// stop here; drafters see only DraftSession.
//
// Drafting runs on a WorkerPool, never on gRPC's callback threads; each session's work is
// serial (at most one task of a session queued or running), so sessions take turns.
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tree/drafter_kind.h"
#include "common/tree/spec_limits.h"
#include "common/util/worker_pool.h"
#include "drafter_service/drafter.h"
#include "drafter_service/drafter_metrics.h"
#include "drafter_service/drafter_registry.h"
#include "treespec/v1/drafter.grpc.pb.h"

namespace treespec {

// A session's request id (logged with every line of it): at most this many bytes of UTF-8, the
// verifier's own limit on request ids (kMaxRequestIdBytes), so any id it accepts passes.
inline constexpr size_t kMaxDraftRequestIdBytes = 256;

struct DrafterServiceOptions {
  DrafterKind default_kind = DrafterKind::kNgram;  // what SPECULATION_MODE_AUTO gets
  // Defaults fill a DraftOpen's unset (0) limits; a session asking more than the maxima runs
  // at the maxima (its DraftOpened says so). The verifiers learn these through GetInfo.
  SpecBounds spec;
  int vocab_size = 0;      // token ids must be in [0, vocab_size); 0 = only >= 0
  int worker_threads = 2;  // drafting threads
  // A session whose verifier has sent nothing for this long (and that is not drafting) is
  // ended: a verifier that died or hung without closing its streams must not hold sessions
  // (and a draft model's KV cache) for ever. Zero: never.
  absl::Duration session_idle_timeout = absl::Seconds(60);
};

// Checks that the options are consistent with the drafters given (the message names the
// option), e.g. the default kind is served and the limits pass ValidateSpecBounds.
absl::Status ValidateDrafterServiceOptions(const DrafterServiceOptions& options,
                                           const DrafterRegistry& drafters);

// Draft is a raw method (ByteBuffers, parsed here): gRPC's own parsing would end the stream at an
// undecodable message as if the verifier had half-closed, with status OK; this way it ends with
// INVALID_ARGUMENT saying which message did not parse.
class DrafterService final : public v1::Drafter::WithRawCallbackMethod_Draft<
                                 v1::Drafter::WithCallbackMethod_GetInfo<v1::Drafter::Service>> {
 public:
  // Serves the kinds in `drafters`. `metrics` (may be null) must outlive the service.
  DrafterService(const DrafterServiceOptions& options, DrafterRegistry drafters,
                 DrafterMetrics* metrics = nullptr);
  // Shut the grpc::Server down first: it waits for every stream to end.
  ~DrafterService() override;
  DrafterService(const DrafterService&) = delete;
  DrafterService& operator=(const DrafterService&) = delete;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Draft(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::DrafterInfoRequest* request,
                                    v1::DrafterInfo* info) override;

  // What GetInfo answers and every DraftOpened carries: this process's id, limits and kinds.
  const v1::DrafterInfo& info() const { return info_; }

  int active_sessions() const { return active_sessions_.load(); }
  int64_t total_sessions() const { return total_sessions_.load(); }

 private:
  class SessionReactor;

  // The reaper thread: every so often, ends the sessions idle past the timeout.
  void ReapIdleSessions();

  const DrafterServiceOptions options_;
  const DrafterRegistry drafters_;
  const v1::DrafterInfo info_;
  DrafterMetrics* const metrics_;  // may be null
  std::atomic<int> active_sessions_{0};
  std::atomic<int64_t> total_sessions_{0};
  std::mutex sessions_mu_;                         // before any session's own mutex, never after
  absl::flat_hash_set<SessionReactor*> sessions_;  // live sessions, for the reaper
  std::condition_variable reaper_cv_;              // with sessions_mu_: wakes it to stop
  bool stopping_ = false;                          // guarded by sessions_mu_
  std::thread reaper_;                             // none when the idle timeout is zero
  WorkerPool pool_;                                // last: its threads stop before the factories go
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
