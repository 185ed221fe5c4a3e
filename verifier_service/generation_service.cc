#include "verifier_service/generation_service.h"

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"
#include "verifier_service/proto_conversion.h"
#include "verifier_service/response_outbox.h"

namespace treespec {

namespace {

// One Generate call: converts, validates and submits the request on the service's admission
// pool (tokenizing a long text must not hold a gRPC callback thread, which health checks need
// too); its ResponseOutbox streams the updates. The call stays open (no Finish) until Admit has
// run, so the reactor outlives its task.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                              public ResponseWriter {
 public:
  GenerateReactor(const GenerationService::Admission& admission, const v1::GenerateRequest* request,
                  std::string request_id)
      : admission_(admission) {
    admission_.pool->Submit(
        [this, request, id = std::move(request_id)]() mutable { Admit(*request, std::move(id)); });
  }

  void Send(const v1::GenerateResponse* response) override { StartWrite(response); }
  void Close(const grpc::Status& status) override { Finish(status); }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  // The client cancelled, went away or passed its deadline: stop the request (frees its KV
  // pages at the next step) and finish the call, which gRPC needs before it calls OnDone. Before
  // admission, Admit sees the flag and finishes the call itself.
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (!submitted_) return;
    admission_.engine->Cancel(handle_);
    outbox_->Cancel();
  }

  void OnDone() override {
    if (outbox_) outbox_->Detach();
    // Normally the engine is done or OnCancel has stopped it; if the call ended some other
    // way, make sure the request does not run on with nobody to read it (a no-op otherwise).
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (submitted_) admission_.engine->Cancel(handle_);
    }
    delete this;
  }

 private:
  // On the admission pool. Every path ends the call or hands it to the engine, and touches
  // nothing of the reactor after Finish (OnDone may delete it at once).
  void Admit(const v1::GenerateRequest& request, std::string id) {
    absl::StatusOr<GenerationRequest> converted =
        FromProto(request, admission_.tokenizer, admission_.bos_token_id,
                  admission_.engine->context_length() - 1, std::move(id));
    absl::Status status = converted.status();
    if (status.ok()) status = admission_.engine->Validate(*converted);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) {
        status = absl::CancelledError("the call was cancelled before its request was admitted");
      } else if (status.ok()) {
        outbox_ = std::make_shared<ResponseOutbox>(this, converted->id, admission_.metrics);
        absl::StatusOr<uint64_t> handle = admission_.engine->Submit(*std::move(converted), outbox_);
        if (handle.ok()) {
          handle_ = *handle;
          submitted_ = true;
          return;  // the outbox finishes the call
        }
        outbox_->Detach();
        status = handle.status();
      }
    }
    Finish(ToGrpcStatus(status));
  }

  const GenerationService::Admission admission_;
  std::shared_ptr<ResponseOutbox> outbox_;  // set by Admit before the first write
  std::mutex mu_;
  uint64_t handle_ = 0;
  bool submitted_ = false;
  bool cancelled_ = false;
};

// The answer while the model loads: the server listens early so health probes see NOT_SERVING.
grpc::Status LoadingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the model is still loading; retry when the health status is SERVING");
}

// Ends a Generate call at once with the refusal the caller passes to Finish (still loading, or
// not authenticated).
class RefusalReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
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
  admission_pool_ = std::make_unique<WorkerPool>(kAdmissionThreads);
  admission_ =
      Admission{engine, tokenizer, model->config().bos_token_id, metrics, admission_pool_.get()};
  active_.store(true, std::memory_order_release);
}

grpc::Status GenerationService::Admit(const grpc::CallbackServerContext& context) const {
  if (grpc::Status auth = auth_.Check(context); !auth.ok()) return auth;
  return active_.load(std::memory_order_acquire) ? grpc::Status::OK : LoadingStatus();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  if (grpc::Status refused = Admit(*context); !refused.ok()) {
    auto* reactor = new RefusalReactor();
    reactor->Finish(refused);
    return reactor;
  }
  std::string id = request->request_id();
  if (id.empty()) id = absl::StrCat("req-", next_id_.fetch_add(1));
  return new GenerateReactor(admission_, request, std::move(id));
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* info) {
  if (grpc::Status refused = Admit(*context); !refused.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(refused);
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
  const SpecBounds spec = engine_->spec_bounds();
  const SpecLimits spec_defaults = ClampSpecLimits(spec.defaults, spec.max);
  info->set_default_tree_budget(spec_defaults.tree_budget);
  info->set_max_tree_budget(spec.max.tree_budget);
  info->set_default_max_depth(spec_defaults.max_depth);
  info->set_drafter_target(info_.drafter_target);
  info->set_max_message_bytes(info_.max_message_bytes);
  info->set_max_batch_size(o.max_batch);
  info->set_max_prompt_tokens(engine_->context_length() - 1);
  info->set_default_max_new_tokens(o.default_max_new_tokens);
  info->set_max_new_tokens_limit(engine_->max_new_tokens_limit());
  info->set_max_depth_limit(spec.max.max_depth);
  info->set_max_queue(o.max_queue);
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
