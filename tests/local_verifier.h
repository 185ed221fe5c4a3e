// An in-process verifier for tests over real gRPC: the engine and the Generation service over a
// model the test owns, served (with grpc.health.v1) on a free loopback port, and a stub to it.
#ifndef TREESPEC_TESTS_LOCAL_VERIFIER_H_
#define TREESPEC_TESTS_LOCAL_VERIFIER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/causal_lm.h"
#include "common/tokenizer/tokenizer.h"
#include "treespec/v1/generation.grpc.pb.h"
#include "verifier_service/drafter_client.h"
#include "verifier_service/engine.h"
#include "verifier_service/generation_service.h"
#include "verifier_service/serving_metrics.h"

namespace treespec::testing {

// The shipped tiny target pair's target (models/tiny-target) on the CPU, for batches of up to
// `max_batch` requests, and its tokenizer.
struct TinyTarget {
  std::unique_ptr<CausalLm> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
absl::StatusOr<TinyTarget> LoadTinyTarget(int max_batch);

struct LocalVerifierOptions {
  std::string drafter;      // gRPC target of the drafter pool; empty = no speculation
  DrafterLinkOptions link;  // how sessions reach it
  EngineOptions engine;
  ServiceInfo info;      // info.max_message_bytes (when > 0) is also the server's receive limit
  bool metrics = false;  // collect ServingMetrics (engine, drafter link and service report)
};

class LocalVerifier {
 public:
  // `model` and `tokenizer` (may be null) must outlive it. Check ok() before use.
  LocalVerifier(CausalLm* model, const Tokenizer* tokenizer, LocalVerifierOptions options);
  // Stops the server, then the engine.
  ~LocalVerifier();
  LocalVerifier(const LocalVerifier&) = delete;
  LocalVerifier& operator=(const LocalVerifier&) = delete;

  bool ok() const { return port_ != 0; }
  int port() const { return port_; }
  grpc::Server* server() { return server_.get(); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  v1::Generation::Stub* stub() { return stub_.get(); }
  Engine* engine() { return engine_.get(); }
  GrpcDraftSource* drafts() { return drafts_.get(); }   // null without a drafter
  ServingMetrics* metrics() { return metrics_.get(); }  // null unless options.metrics

  // GetModelInfo (a failed call is a test failure).
  v1::ModelInfo Info();
  // Waits until no request runs or waits and every KV page is free; whether that happened.
  bool WaitForAllPagesFree(absl::Duration patience = absl::Seconds(60));

 private:
  std::unique_ptr<ServingMetrics> metrics_;  // first: outlives every session that reports
  std::unique_ptr<GrpcDraftSource> drafts_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace treespec::testing

#endif  // TREESPEC_TESTS_LOCAL_VERIFIER_H_
