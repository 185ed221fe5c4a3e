// treespec-loadgen's client: sends Generate requests to the verifiers on a schedule with gRPC's
// callback API (one reactor per request, no thread per request) and times every stream.
//
// Each target gets its own channel with client-side health checking (round_robin over what the
// address resolves to, `healthCheckConfig`), so a verifier that reports NOT_SERVING (draining)
// turns its channel TRANSIENT_FAILURE and new requests skip it. Requests go round-robin over the
// targets whose channels are not failing. A request refused with UNAVAILABLE before any message
// (a verifier that began draining before its health said so, or went away) is sent on to the
// next target when failover is on, keeping its original send time; a request that had started
// streaming is never retried.
//
// A request may carry a CancelPoint (cancel_plan.h): the client then cancels it after so many
// tokens, or on a timer (TimerThread) before its first token, and it ends as cancelled rather
// than failed; a cancelled request is not sent on to another target.
#ifndef TREESPEC_TOOLS_LOADGEN_DRIVER_H_
#define TREESPEC_TOOLS_LOADGEN_DRIVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tools/loadgen/cancel_plan.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/request_result.h"
#include "tools/loadgen/run_config.h"
#include "tools/loadgen/timer_thread.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec::loadgen {

// The Generate request for `prompt`, the `index`-th of the dataset.
v1::GenerateRequest BuildRequest(const Prompt& prompt, int index, const RequestOptions& options);

// A request that a finished one leads to (a conversation's next turn, a stream that replaces
// one that ended), sent `delay_s` after the end; with `same_target` to the target that answered
// the one before (while its channel is not failing), as a client with session affinity does, so
// a conversation meets the server that holds its cached prefix.
struct FollowUp {
  Prompt prompt;
  double delay_s = 0;
  bool same_target = false;
};
// Called when request `prompt` has ended with `result` (after its last attempt), under the
// run's lock, so it must be quick; `sent_all`: every scheduled prompt has been sent. nullopt:
// nothing follows.
using FollowUpFn = std::function<std::optional<FollowUp>(
    const Prompt& prompt, const RequestResult& result, bool sent_all)>;

struct ScheduleOptions {
  int max_concurrency = 0;  // requests in flight at most; 0 = no bound
  double duration_s = 0;    // no request is sent after this many seconds; 0 = no bound
  double request_timeout_s = 600;
  bool failover = true;
  FollowUpFn follow_up;  // none: requests lead to nothing
};

struct RunResult {
  std::vector<RequestResult> requests;  // the sent ones, by index
  // By index: the scheduled prompts, then the follow-ups in the order they were made.
  std::vector<Prompt> prompts;
  double duration_s = 0;  // from the start to the last request's end
  int not_sent = 0;       // scheduled prompts left out by the duration bound
};

class Driver {
 public:
  // `credentials`: plaintext when null; `bearer_token`: sent with every call unless empty.
  explicit Driver(std::vector<std::string> targets,
                  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                  std::string bearer_token = "");
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const std::vector<std::string>& targets() const { return targets_; }

  // GetModelInfo of every target, waiting up to `timeout` for each to accept connections;
  // the first failure as UNAVAILABLE (or the server's code) naming the target.
  absl::StatusOr<std::vector<v1::ModelInfo>> ModelInfos(absl::Duration timeout);

  // Sends prompts[i] at send_times[i] seconds after the start (waiting for a free slot under
  // max_concurrency) until the prompts or the duration run out, cancels request i at
  // cancels[i] (no cancels when `cancels` is empty; follow-ups are never cancelled), sends what
  // schedule.follow_up makes of each ended request when it comes due (within the duration), and
  // returns once every sent request has ended and none follows. `progress` may be null.
  RunResult Run(absl::Span<const Prompt> prompts, absl::Span<const double> send_times,
                absl::Span<const CancelPoint> cancels, const RequestOptions& request_options,
                const ScheduleOptions& schedule, ProgressBar* progress);

 private:
  class Call;
  struct RunState;

  // The target for a request that would go to `preferred`: the first from it on whose channel
  // is not failing, or `preferred` when all are.
  int PickTarget(int preferred);
  // Starts attempt `attempt` of `state`'s request `index` on target `target`; `sent` is when
  // its first attempt was sent.
  void Launch(RunState* state, int index, int target, int attempt,
              std::chrono::steady_clock::time_point sent);
  // Called once per attempt from the reactor's OnDone: records the request's result, or sends it
  // on to another target (and returns false).
  bool OnCallDone(Call* call, const grpc::Status& status);
  // Called once per request after its last attempt's reactor is gone: Run may return once all
  // have been.
  void OnRequestEnded(RunState* state);

  const std::vector<std::string> targets_;
  const std::string bearer_token_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs_;
  std::atomic<uint64_t> next_target_{0};
  TimerThread timers_;  // the before-first-token cancels
};

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_DRIVER_H_
