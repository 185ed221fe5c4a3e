#include "verifier_service/generation_service.h"

#include <deque>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/status_conversion.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {

namespace {

// Streams one request's updates. The engine holds the Outbox (as a RequestSink); the reactor
// holds it too. Whichever ends first, the other never touches freed memory: the reactor clears
// its pointer in OnDone under the outbox's lock.
class GenerateReactor;

class Outbox final : public RequestSink {
 public:
  Outbox(GenerateReactor* reactor, std::string request_id, ServingMetrics* metrics)
      : reactor_(reactor),
        request_id_(std::move(request_id)),
        metrics_(metrics),
        arrived_(absl::Now()) {}
  // Engine thread: queues the update and starts a write when none is in flight.
  void OnUpdate(GenerationUpdate update) override;
  // gRPC: the previous write finished (ok = false: the client is gone).
  void OnWriteDone(bool ok);
  // gRPC: the call was cancelled; finish it as soon as no write is in flight.
  void Cancel();
  // gRPC: the reactor is gone; later updates are dropped.
  void Detach();

 private:
  // Starts the next write, or finishes the call when nothing is left. Finish happens once.
  void PumpLocked();

  // Records the update's latencies and, when it is the last, the request's counts.
  void ObserveLocked(const GenerationUpdate& update);

  std::mutex mu_;
  GenerateReactor* reactor_;
  std::string request_id_;
  ServingMetrics* metrics_;  // may be null
  absl::Time arrived_;
  absl::Time last_tokens_;  // when tokens last reached the stream
  bool seen_tokens_ = false;
  std::deque<v1::GenerateResponse> queue_;  // front() is in flight while writing_
  bool writing_ = false;
  bool last_queued_ = false;  // the final update has been queued
  bool cancelled_ = false;
  bool finish_called_ = false;
  grpc::Status final_status_;
};

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine* engine, const v1::GenerateRequest& request, const Tokenizer* tokenizer,
                  int32_t bos, std::string request_id, ServingMetrics* metrics)
      : engine_(engine) {
    absl::StatusOr<GenerationRequest> converted =
        FromProto(request, tokenizer, bos, std::move(request_id));
    absl::Status status = converted.status();
    if (status.ok()) status = engine_->Validate(*converted);
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    outbox_ = std::make_shared<Outbox>(this, converted->id, metrics);
    absl::StatusOr<uint64_t> handle = engine_->Submit(*std::move(converted), outbox_);
    if (!handle.ok()) {
      outbox_->Detach();
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    handle_ = *handle;
    submitted_ = true;
  }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  // The client cancelled or went away: stop the request (frees its KV pages at the next step)
  // and finish the call, which gRPC needs before it calls OnDone.
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!submitted_) return;
    engine_->Cancel(handle_);
    outbox_->Cancel();
  }

  void OnDone() override {
    if (outbox_) outbox_->Detach();
    // Normally the engine is done or OnCancel has stopped it; if the call ended some other
    // way, make sure the request does not run on with nobody to read it (a no-op otherwise).
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (submitted_) engine_->Cancel(handle_);
    }
    delete this;
  }

 private:
  Engine* engine_;
  std::shared_ptr<Outbox> outbox_;
  std::mutex mu_;
  uint64_t handle_ = 0;
  bool submitted_ = false;
};

void Outbox::ObserveLocked(const GenerationUpdate& update) {
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

void Outbox::OnUpdate(GenerationUpdate update) {
  std::lock_guard<std::mutex> lock(mu_);
  ObserveLocked(update);  // also when the client is gone: the work was done
  if (reactor_ == nullptr || last_queued_ || cancelled_) return;
  if (update.finished) {
    last_queued_ = true;
    final_status_ = ToGrpcStatus(update.status);
    // A failed request ends with its status; tokens already streamed stay with the client.
    if (!update.status.ok()) {
      PumpLocked();
      return;
    }
  }
  queue_.push_back(ToProto(update, request_id_));
  PumpLocked();
}

void Outbox::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  queue_.pop_front();
  if (!ok) cancelled_ = true;  // the stream is broken: nothing more can be written
  PumpLocked();
}

void Outbox::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  PumpLocked();
}

void Outbox::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  reactor_ = nullptr;
}

void Outbox::PumpLocked() {
  if (reactor_ == nullptr || writing_ || finish_called_) return;
  if (cancelled_) {
    finish_called_ = true;
    reactor_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"));
  } else if (!queue_.empty()) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front());
  } else if (last_queued_) {
    finish_called_ = true;
    reactor_->Finish(final_status_);
  }
}

// The answer while the model loads: the server listens early so health probes see NOT_SERVING.
grpc::Status LoadingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the model is still loading; retry when the health status is SERVING");
}

// Ends a Generate call at once (the status is set by the caller through Finish).
class LoadingReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  void OnDone() override { delete this; }
};

}  // namespace

GenerationService::GenerationService(Engine* engine, const CausalLm* model,
                                     const Tokenizer* tokenizer, ServiceInfo info,
                                     ServingMetrics* metrics) {
  Activate(engine, model, tokenizer, std::move(info), metrics);
}

void GenerationService::Activate(Engine* engine, const CausalLm* model, const Tokenizer* tokenizer,
                                 ServiceInfo info, ServingMetrics* metrics) {
  engine_ = engine;
  metrics_ = metrics;
  model_ = model;
  tokenizer_ = tokenizer;
  info_ = std::move(info);
  active_.store(true, std::memory_order_release);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* request) {
  if (!active_.load(std::memory_order_acquire)) {
    auto* reactor = new LoadingReactor();
    reactor->Finish(LoadingStatus());
    return reactor;
  }
  std::string id = request->request_id();
  if (id.empty()) id = absl::StrCat("req-", next_id_.fetch_add(1));
  return new GenerateReactor(engine_, *request, tokenizer_, model_->config().bos_token_id,
                             std::move(id), metrics_);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* info) {
  if (!active_.load(std::memory_order_acquire)) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(LoadingStatus());
    return reactor;
  }
  const ModelConfig& c = model_->config();
  const EngineOptions& o = engine_->options();
  info->set_model_name(info_.model_name);
  info->set_architecture(c.architecture);
  info->set_vocab_size(c.vocab_size);
  info->set_context_length(engine_->context_length());
  info->set_num_layers(c.num_layers);
  info->set_hidden_size(c.hidden_size);
  info->set_tensor_parallel(info_.tensor_parallel);
  info->mutable_eos_token_ids()->Add(c.eos_token_ids.begin(), c.eos_token_ids.end());
  info->set_bos_token_id(c.bos_token_id);
  info->set_device(info_.device);
  info->set_default_tree_budget(o.default_tree_budget);
  info->set_max_tree_budget(o.max_tree_budget);
  info->set_default_max_depth(o.default_max_depth);
  info->set_drafter_target(info_.drafter_target);
  info->set_max_batch_size(o.max_batch);
  info->set_max_prompt_tokens(engine_->context_length() - 1);
  info->set_default_max_new_tokens(o.default_max_new_tokens);
  const EngineSnapshot snap = engine_->Snapshot();
  info->set_kv_cache_pages(snap.kv_pages_total);
  info->set_kv_page_size(snap.kv_page_size);
  info->set_kv_pages_free(snap.kv_pages_free);
  info->set_requests_running(snap.running);
  info->set_requests_queued(snap.queued);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace treespec
