#include "verifier_service/response_outbox.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/rpc/status_conversion.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {

void MergeResponse(v1::GenerateResponse& into, const v1::GenerateResponse& next) {
  // MergeFrom appends repeated fields (the ids) and takes set scalars and messages (the final
  // fields); only the text needs joining by hand.
  std::string text = into.text() + next.text();
  into.MergeFrom(next);
  into.set_text(std::move(text));
}

ResponseOutbox::ResponseOutbox(ResponseWriter* writer, std::string request_id,
                               ServingMetrics* metrics)
    : writer_(writer),
      request_id_(std::move(request_id)),
      metrics_(metrics),
      arrived_(absl::Now()) {}

void ResponseOutbox::ObserveLocked(const GenerationUpdate& update) {
  if (metrics_ == nullptr) return;
  if (!update.token_ids.empty()) {
    const absl::Time now = absl::Now();
    if (seen_tokens_) {
      metrics_->ObserveInterTokenLatency(absl::ToDoubleSeconds(now - last_tokens_));
    } else {
      metrics_->ObserveTimeToFirstToken(absl::ToDoubleSeconds(now - arrived_));
      seen_tokens_ = true;
    }
    last_tokens_ = now;
  }
  if (update.finished) metrics_->OnFinished(update);
}

void ResponseOutbox::OnUpdate(GenerationUpdate update) {
  std::lock_guard<std::mutex> lock(mu_);
  ObserveLocked(update);  // also when the client is gone: the work was done
  if (writer_ == nullptr || last_queued_ || cancelled_) return;
  if (update.finished) {
    last_queued_ = true;
    final_status_ = ToGrpcStatus(update.status);
    // A failed request ends with its status; tokens already streamed stay with the client.
    if (!update.status.ok()) {
      PumpLocked();
      return;
    }
  }
  v1::GenerateResponse response = ToProto(update, request_id_);
  if (pending_.has_value()) {
    MergeResponse(*pending_, response);
  } else {
    pending_ = std::move(response);
  }
  PumpLocked();
}

void ResponseOutbox::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.reset();
  if (!ok) cancelled_ = true;  // the stream is broken: nothing more can be written
  PumpLocked();
}

void ResponseOutbox::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  PumpLocked();
}

void ResponseOutbox::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  writer_ = nullptr;
}

void ResponseOutbox::PumpLocked() {
  if (writer_ == nullptr || in_flight_.has_value() || closed_) return;
  if (cancelled_) {
    closed_ = true;
    pending_.reset();
    writer_->Close(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"));
  } else if (pending_.has_value()) {
    in_flight_ = std::move(pending_);
    pending_.reset();
    writer_->Send(&*in_flight_);
  } else if (last_queued_) {
    closed_ = true;
    writer_->Close(final_status_);
  }
}

}  // namespace treespec
