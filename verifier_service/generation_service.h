// The public Generation gRPC service (callback API): converts protos, validates, hands the
// request to the engine and streams its updates back.
#ifndef TREESPEC_VERIFIER_SERVICE_GENERATION_SERVICE_H_
#define TREESPEC_VERIFIER_SERVICE_GENERATION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/rpc/bearer_auth.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/worker_pool.h"
#include "treespec/v1/generation.grpc.pb.h"
#include "verifier_service/engine.h"
#include "verifier_service/serving_metrics.h"

namespace treespec {

struct ServiceInfo {
  std::string model_name;
  std::string device;
  int tensor_parallel = 1;
  std::string drafter_target;
  int max_message_bytes = 0;  // the server's receive limit, as configured on its builder
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // A service that answers UNAVAILABLE ("the model is still loading") until Activate, so the
  // server can listen (and report NOT_SERVING to health probes) while the model loads.
  GenerationService() = default;
  // A service that serves at once.
  GenerationService(Engine* engine, const CausalLm* model, const Tokenizer* tokenizer,
                    ServiceInfo info, ServingMetrics* metrics = nullptr);
  // Starts serving with the loaded model; call once, before the health status goes SERVING.
  // The pointers must outlive the service; `metrics` (may be null) gets every request's
  // latencies and, when it ends, its counts.
  void Activate(Engine* engine, const CausalLm* model, const Tokenizer* tokenizer, ServiceInfo info,
                ServingMetrics* metrics = nullptr);
  // From now on every call must carry one of `tokens` (common/rpc/bearer_auth.h); call before
  // the server starts. By default no token is needed.
  void RequireBearerTokens(BearerTokens tokens) { auth_ = std::move(tokens); }

  // What a Generate call needs to admit its request, fixed by Activate.
  struct Admission {
    Engine* engine = nullptr;
    const Tokenizer* tokenizer = nullptr;  // null: ids only
    int32_t bos_token_id = -1;
    ServingMetrics* metrics = nullptr;
    WorkerPool* pool = nullptr;  // where requests are tokenized, validated and submitted
  };
  // Threads that tokenize and admit requests: a text's tokens cost about 1 µs each, far less
  // than their prefill, so two keep up with any verifier and leave the cores to it.
  static constexpr int kAdmissionThreads = 2;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  // OK, or why the call is refused: no accepted bearer token, else the model still loading.
  grpc::Status Admit(const grpc::CallbackServerContext& context) const;

  BearerTokens auth_;
  // Set by Activate before active_ (release); read after active_ (acquire).
  Engine* engine_ = nullptr;
  const CausalLm* model_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
  ServingMetrics* metrics_ = nullptr;
  ServiceInfo info_;
  Admission admission_;
  // Last but one: its threads finish the queued admissions (each ends or hands on its call)
  // before the members above go; the server has shut down by then, so none is added.
  std::unique_ptr<WorkerPool> admission_pool_;
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_GENERATION_SERVICE_H_
