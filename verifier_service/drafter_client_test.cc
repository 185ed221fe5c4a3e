// The gRPC draft source against a real in-process drafter (ngram) on loopback.
#include "verifier_service/drafter_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

// The engine's arrival callback locks the engine's mutex, so once a stream is destroyed the
// callback must not be running any more: the engine may be gone right after (Engine::Shutdown
// releases every stream, then the Engine is destroyed).
TEST(GrpcDraftSourceTest, DestroyingTheStreamWaitsForARunningArrivalCallback) {
  DrafterServiceOptions options;
  options.vocab_size = 512;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions{}));
  DrafterService service(options, std::move(drafters));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);

  GrpcDraftSource source("127.0.0.1:" + std::to_string(port));
  std::atomic<bool> entered{false}, released{false}, ran_after_release{false};
  std::atomic<int> returned{0};
  DraftOpenParams params;
  params.request_id = "callback-lifetime";
  params.prompt = {5, 6, 7, 5, 6, 7, 5, 6};
  params.mode = SpecMode::Of(DrafterKind::kNgram);
  params.limits = SpecLimits{4, 4, 0};
  std::unique_ptr<DraftStream> stream = source.Open(params, [&] {
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (released) ran_after_release = true;
    ++returned;
  });
  stream->Commit(0, TokenContext({7}));
  for (int i = 0; i < 1000 && !entered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(entered) << "no draft arrived";
  stream.reset();
  released = true;
  for (int i = 0; i < 100 && returned == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ran_after_release) << "the arrival callback was still running after the stream "
                                     "was destroyed";
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace treespec
