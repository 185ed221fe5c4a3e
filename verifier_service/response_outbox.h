// One Generate call's outgoing side: the engine's updates for a request become GenerateResponse
// messages, written one at a time. While a write is in flight (a slow client, or one that
// never reads, whose HTTP/2 window has filled) later updates merge into a single pending
// message, so a call buffers at most two messages — together no more than the request's own
// output — however far its client lags, and the engine thread never waits for the network.
#ifndef TREESPEC_VERIFIER_SERVICE_RESPONSE_OUTBOX_H_
#define TREESPEC_VERIFIER_SERVICE_RESPONSE_OUTBOX_H_

#include <grpcpp/support/status.h>

#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "treespec/v1/generation.pb.h"
#include "verifier_service/engine.h"
#include "verifier_service/request.h"
#include "verifier_service/serving_metrics.h"

namespace treespec {

// The call as the outbox drives it (the gRPC reactor: StartWrite and Finish).
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Starts writing `response`, which stays alive until the outbox's OnWriteDone.
  virtual void Send(const v1::GenerateResponse* response) = 0;
  // Ends the call; called once, with no write in flight.
  virtual void Close(const grpc::Status& status) = 0;
};

// Appends `next` (a later update of the same request) to `into`: ids and text concatenated, and
// the final fields (finish reason, usage, statistics) when `next` has them.
void MergeResponse(v1::GenerateResponse& into, const v1::GenerateResponse& next);

// The engine holds the outbox (as a RequestSink) and so does the reactor. Whichever ends first,
// the other never touches freed memory: the reactor detaches in OnDone under the outbox's lock.
class ResponseOutbox final : public RequestSink {
 public:
  // `metrics` (may be null) gets the request's latencies and, at its end, its counts.
  ResponseOutbox(ResponseWriter* writer, std::string request_id, ServingMetrics* metrics);

  // Engine thread: queues (or merges) the update and starts a write when none is in flight.
  void OnUpdate(GenerationUpdate update) override;
  // gRPC: the previous write finished (ok = false: the client is gone).
  void OnWriteDone(bool ok);
  // gRPC: the call was cancelled; it ends as soon as no write is in flight.
  void Cancel();
  // gRPC: the call is over; later updates are dropped.
  void Detach();

 private:
  // Starts the next write, or ends the call when nothing is left. Close happens once.
  void PumpLocked();
  // Records the update's latencies and, when it is the last, the request's counts.
  void ObserveLocked(const GenerationUpdate& update);

  std::mutex mu_;
  ResponseWriter* writer_;  // null once detached
  const std::string request_id_;
  ServingMetrics* const metrics_;  // may be null
  const absl::Time arrived_;
  absl::Time last_tokens_;  // when tokens last reached the stream
  bool seen_tokens_ = false;
  std::optional<v1::GenerateResponse> in_flight_;  // being written
  std::optional<v1::GenerateResponse> pending_;    // everything since, merged
  bool last_queued_ = false;                       // the final update has been queued
  bool cancelled_ = false;
  bool closed_ = false;
  grpc::Status final_status_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_RESPONSE_OUTBOX_H_
