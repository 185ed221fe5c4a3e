// One source of truth for speculation limits, over real gRPC: the drafters own their maxima
// (--max_tree_budget) and state them; a verifier over two drafters of different limits admits
// what the larger serves, refuses more with INVALID_ARGUMENT naming the drafters' flag, and a
// request whose session lands on the smaller drafter runs with that drafter's trees — never
// silently without speculation. Output equals speculation off token for token throughout.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/local_verifier.h"

namespace treespec {
namespace {

using testing::Generate;
using ::testing::HasSubstr;
using testing::Outcome;

struct NgramDrafter {
  std::unique_ptr<DrafterService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// An ngram drafter serving trees of at most `max_tree_budget` nodes (default `tree_budget`).
std::unique_ptr<NgramDrafter> StartNgramDrafter(int tree_budget, int max_tree_budget) {
  auto d = std::make_unique<NgramDrafter>();
  DrafterServiceOptions options;
  options.spec.defaults = {tree_budget, 8, 0};
  options.spec.max = {max_tree_budget, kSpecCeiling.max_depth, max_tree_budget};
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions()));
  EXPECT_TRUE(ValidateDrafterServiceOptions(options, drafters).ok());
  d->service = std::make_unique<DrafterService>(options, std::move(drafters));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &d->port);
  builder.RegisterService(d->service.get());
  d->server = builder.BuildAndStart();
  EXPECT_NE(d->port, 0);
  return d;
}

class DrafterLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TinyTarget> target = testing::LoadTinyTarget(8);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    small_ = StartNgramDrafter(4, 4);
    large_ = StartNgramDrafter(16, 32);
  }
  void TearDown() override {
    for (NgramDrafter* d : {small_.get(), large_.get()}) d->server->Shutdown();
  }

  // A verifier over `drafters` (gRPC target) that polls them quickly, once it has heard from
  // `expect` of them.
  std::unique_ptr<testing::LocalVerifier> StartVerifier(const std::string& drafters, int expect) {
    testing::LocalVerifierOptions options;
    options.drafter = drafters;
    options.link.info_period = absl::Milliseconds(100);
    options.engine.max_batch = 8;
    options.engine.draft_timeout = absl::Seconds(2);  // a slow CI machine still drafts
    auto verifier = std::make_unique<testing::LocalVerifier>(target_.model.get(),
                                                             target_.tokenizer.get(), options);
    EXPECT_TRUE(verifier->ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (verifier->drafts()->PoolInfo().drafters < expect && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(verifier->drafts()->PoolInfo().drafters, expect);
    return verifier;
  }

  static std::string Target(const NgramDrafter& d) { return absl::StrCat("127.0.0.1:", d.port); }

  // A code prompt said twice, so the ngram drafter matches from the first step; greedy.
  static v1::GenerateRequest Request(int i, v1::SpeculationMode mode, int tree_budget) {
    const std::string& code = testing::CodePrompts()[i % testing::CodePrompts().size()];
    v1::GenerateRequest r = testing::TextRequest(code + "\n" + code, mode, 32);
    if (tree_budget > 0) r.mutable_speculation()->set_tree_budget(tree_budget);
    return r;
  }

  testing::TinyTarget target_;
  std::unique_ptr<NgramDrafter> small_, large_;
};

TEST_F(DrafterLimitsTest, VerifierServesWhatItsDraftersStateAndRefusesMore) {
  auto verifier = StartVerifier(absl::StrCat("ipv4:", Target(*small_), ",", Target(*large_)), 2);
  const v1::ModelInfo info = verifier->Info();
  EXPECT_EQ(info.max_tree_budget(), 32);  // the larger drafter's --max_tree_budget
  EXPECT_EQ(info.default_tree_budget(), 16);

  const Outcome refused = Generate(verifier->stub(), Request(0, v1::SPECULATION_MODE_NGRAM, 33));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("speculation.tree_budget must be in [1, 32] (got 33); 32 is the largest "
                        "--max_tree_budget of the 2 drafter(s)"));

  // Budget 16: sessions alternate over both drafters; those on the small one run at its 4.
  for (int i = 0; i < 8; ++i) {
    const Outcome off = Generate(verifier->stub(), Request(i, v1::SPECULATION_MODE_OFF, 0));
    const Outcome spec = Generate(verifier->stub(), Request(i, v1::SPECULATION_MODE_NGRAM, 16));
    ASSERT_TRUE(off.status.ok()) << off.status.error_message();
    ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
    EXPECT_EQ(spec.ids, off.ids) << "prompt " << i;
    const v1::SpeculationStats& s = spec.last.speculation();
    EXPECT_GT(s.drafted_tokens(), 0) << "prompt " << i << ": ran without speculation";
    EXPECT_LE(s.drafted_tokens(), 16 * s.steps());
  }
  EXPECT_GT(small_->service->total_sessions(), 0);
  EXPECT_GT(large_->service->total_sessions(), 0);
}

TEST_F(DrafterLimitsTest, ADefaultAboveTheDraftersIsLoweredAndMoreIsRefused) {
  auto verifier = StartVerifier(Target(*small_), 1);
  const v1::ModelInfo info = verifier->Info();
  EXPECT_EQ(info.max_tree_budget(), 4);
  EXPECT_EQ(info.default_tree_budget(), 4);  // the verifier's --tree_budget 16, lowered

  const Outcome refused = Generate(verifier->stub(), Request(1, v1::SPECULATION_MODE_NGRAM, 16));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("must be in [1, 4] (got 16); 4 is the largest --max_tree_budget"));

  const Outcome off = Generate(verifier->stub(), Request(1, v1::SPECULATION_MODE_OFF, 0));
  const Outcome spec = Generate(verifier->stub(), Request(1, v1::SPECULATION_MODE_AUTO, 0));
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, off.ids);
  const v1::SpeculationStats& s = spec.last.speculation();
  EXPECT_GT(s.drafted_tokens(), 0);
  EXPECT_LE(s.drafted_tokens(), 4 * s.steps());
  // The drafter serves no draft model: asking for one is refused, not run without speculation.
  const Outcome model = Generate(verifier->stub(), Request(1, v1::SPECULATION_MODE_DRAFT_MODEL, 0));
  EXPECT_EQ(model.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(model.status.error_message(), HasSubstr("--draft_model"));
}

}  // namespace
}  // namespace treespec
