#include "tests/local_verifier.h"

#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "gtest/gtest.h"

namespace treespec::testing {

absl::StatusOr<TinyTarget> LoadTinyTarget(int max_batch) {
  const std::string dir = std::string(TREESPEC_SOURCE_DIR) + "/models/tiny-target";
  LmOptions lm;
  lm.max_batch = max_batch;
  TinyTarget target;
  ASSIGN_OR_RETURN(target.model, LoadCpuCausalLm(dir, lm));
  ASSIGN_OR_RETURN(target.tokenizer, LoadTokenizer(dir + "/tokenizer.json"));
  return target;
}

LocalVerifier::LocalVerifier(CausalLm* model, const Tokenizer* tokenizer,
                             LocalVerifierOptions options) {
  if (!options.drafter.empty()) {
    drafts_ = std::make_unique<GrpcDraftSource>(options.drafter, nullptr, options.link);
  }
  engine_ = std::make_unique<Engine>(model, tokenizer, drafts_.get(), options.engine);
  if (options.metrics) {
    metrics_ = std::make_unique<ServingMetrics>([this] { return engine_->Snapshot(); });
    if (drafts_ != nullptr) drafts_->SetMetrics(metrics_.get());
  }
  const int max_message_bytes = options.info.max_message_bytes;
  service_ = std::make_unique<GenerationService>(engine_.get(), model, tokenizer,
                                                 std::move(options.info), metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  if (max_message_bytes > 0) builder.SetMaxReceiveMessageSize(max_message_bytes);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) port_ = 0;
  channel_ =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
  stub_ = v1::Generation::NewStub(channel_);
}

LocalVerifier::~LocalVerifier() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  engine_->Shutdown();
}

v1::ModelInfo LocalVerifier::Info() {
  grpc::ClientContext context;
  v1::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return info;
}

bool LocalVerifier::WaitForAllPagesFree(absl::Duration patience) {
  const absl::Time deadline = absl::Now() + patience;
  while (absl::Now() < deadline) {
    const v1::ModelInfo info = Info();
    if (info.requests_running() == 0 && info.requests_queued() == 0 &&
        info.kv_pages_free() == info.kv_cache_pages()) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace treespec::testing
