// The gRPC draft source against a real in-process drafter (ngram, draft model) on loopback.
#include "verifier_service/drafter_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

// An in-process drafter on loopback.
struct LocalDrafter {
  std::unique_ptr<DrafterService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

LocalDrafter StartDrafter(DrafterServiceOptions options, DrafterRegistry drafters) {
  LocalDrafter d;
  d.service = std::make_unique<DrafterService>(options, std::move(drafters));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(d.service.get());
  d.server = builder.BuildAndStart();
  EXPECT_NE(port, 0);
  d.address = "127.0.0.1:" + std::to_string(port);
  return d;
}

// The engine's arrival callback locks the engine's mutex, so once a stream is destroyed the
// callback must not be running any more: the engine may be gone right after (Engine::Shutdown
// releases every stream, then the Engine is destroyed).
TEST(GrpcDraftSourceTest, DestroyingTheStreamWaitsForARunningArrivalCallback) {
  DrafterServiceOptions options;
  options.vocab_size = 512;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions{}));
  LocalDrafter drafter = StartDrafter(options, std::move(drafters));
  GrpcDraftSource source(drafter.address);
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
  stream->Commit(0, TokenContext({7}), 0);
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
  drafter.server->Shutdown(std::chrono::system_clock::now());
}

// A commit's tree budget reaches the drafter: the draft model (whose trees fill their budget)
// answers with that many nodes, or with the session's when the commit asks for none.
TEST(GrpcDraftSourceTest, ACommitsTreeBudgetLimitsItsTree) {
  const ModelConfig config = testing::SmallLlamaConfig();
  auto lm = CreateCpuCausalLm(config, testing::RandomWeights(config, 5), LmOptions{});
  ASSERT_TRUE(lm.ok()) << lm.status();
  DrafterServiceOptions options;
  options.vocab_size = config.vocab_size;
  options.default_kind = DrafterKind::kDraftModel;
  DrafterRegistry drafters;
  DraftModelOptions draft_options;
  draft_options.shape = DraftShape::kTree;
  drafters.Add(DrafterKind::kDraftModel,
               std::make_unique<DraftModelDrafterFactory>(*std::move(lm), draft_options));
  LocalDrafter drafter = StartDrafter(options, std::move(drafters));
  GrpcDraftSource source(drafter.address);
  DraftOpenParams params;
  params.request_id = "commit-budget";
  params.prompt = {5, 6, 7, 5, 6, 7, 5, 6};
  params.mode = SpecMode::Of(DrafterKind::kDraftModel);
  params.limits = SpecLimits{10, 4, 0};
  std::atomic<int> arrivals{0};
  std::unique_ptr<DraftStream> stream = source.Open(params, [&] { ++arrivals; });
  const int budgets[] = {3, 0, 7};
  const size_t want[] = {3, 10, 7};
  for (int step = 0; step < 3; ++step) {
    stream->Commit(step, TokenContext({7 + step}), budgets[step]);
    std::optional<DraftedTree> tree;
    for (int i = 0; i < 1000 && !tree.has_value(); ++i) {
      tree = stream->TakeTree(step);
      if (!tree.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(tree.has_value()) << "no tree for step " << step << " (session "
                                  << (stream->broken() ? "broken" : "open") << ")";
    EXPECT_EQ(tree->tokens.size(), want[step]) << "step " << step;
  }
  stream.reset();
  drafter.server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace treespec
