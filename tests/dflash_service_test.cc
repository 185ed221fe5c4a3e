// DFlash over real gRPC on loopback (in-process servers on port 0): a drafter serving a random
// DFlash model for the shipped tiny target (tests/data/models/dflash_random) and a verifier on
// that target. The verifier captures the drafter's target layers and streams their rows commit
// by commit (a long prompt's in parts); the drafter drafts from them; the output equals
// speculation off, greedy and seeded sampling, asked as DFLASH or as AUTO (the pool's default).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/backend/load_model.h"
#include "common/tokenizer/tokenizer.h"
#include "drafter_service/dflash_drafter.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/local_verifier.h"

namespace treespec {
namespace {

using testing::CodePrompts;
using testing::Generate;
using testing::Outcome;
using testing::TextRequest;

const std::string kRoot = TREESPEC_SOURCE_DIR;

class DflashServiceTest : public ::testing::Test {
 protected:
  virtual std::string DrafterDir() const { return kRoot + "/tests/data/models/dflash_random"; }

  void SetUp() override {
    absl::StatusOr<DflashLm> model =
        LoadDflashLm(DrafterDir(), kRoot + "/models/tiny-target", "cpu", LmOptions{.max_batch = 4});
    ASSERT_TRUE(model.ok()) << model.status();
    DrafterServiceOptions options;
    options.default_kind = DrafterKind::kDflash;
    options.vocab_size = model->config.body.vocab_size;
    DrafterRegistry drafters;
    drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions()));
    drafters.Add(DrafterKind::kDflash,
                 std::make_unique<DflashDrafterFactory>(std::move(model->config),
                                                        std::move(model->lm), DflashOptions()));
    drafter_ = std::make_unique<DrafterService>(options, std::move(drafters));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(drafter_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);

    absl::StatusOr<testing::TinyTarget> target = testing::LoadTinyTarget(4);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = std::move(target->model);
    tokenizer_ = std::move(target->tokenizer);
    testing::LocalVerifierOptions v;
    v.drafter = "127.0.0.1:" + std::to_string(port);
    v.engine.max_batch = 4;
    v.engine.draft_timeout = absl::Seconds(5);  // every step waits: a slow CI machine too
    verifier_ = std::make_unique<testing::LocalVerifier>(target_.get(), tokenizer_.get(), v);
    ASSERT_TRUE(verifier_->ok());
    // AUTO resolves to DFLASH only once the verifier knows its pool's default.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (verifier_->drafts()->PoolInfo().drafters == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(verifier_->drafts()->PoolInfo().default_kind, DrafterKind::kDflash);
  }

  void TearDown() override {
    verifier_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::unique_ptr<DrafterService> drafter_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CausalLm> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<testing::LocalVerifier> verifier_;
};

TEST_F(DflashServiceTest, DflashSpeculationMatchesPlainDecoding) {
  for (const std::string& prompt : {CodePrompts()[0], CodePrompts()[1]}) {
    for (float temperature : {0.0f, 0.8f}) {
      v1::GenerateRequest off = TextRequest(prompt, v1::SPECULATION_MODE_OFF, 24);
      off.mutable_sampling()->set_temperature(temperature);
      off.mutable_sampling()->set_seed(5);
      const Outcome plain = Generate(verifier_->stub(), off);
      ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
      for (v1::SpeculationMode mode : {v1::SPECULATION_MODE_DFLASH, v1::SPECULATION_MODE_AUTO}) {
        v1::GenerateRequest r = off;
        r.mutable_speculation()->set_mode(mode);
        const Outcome spec = Generate(verifier_->stub(), r);
        ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
        EXPECT_EQ(spec.ids, plain.ids) << "mode " << mode << " temperature " << temperature;
        // Every step had a drafted tree: the drafter got its features and drafted from them.
        const v1::SpeculationStats& stats = spec.last.speculation();
        EXPECT_GT(stats.drafted_tokens(), 0) << "mode " << mode;
        EXPECT_EQ(stats.fallback_steps(), 0) << "mode " << mode;
      }
    }
  }
}

// DDTree at its paper's peak budget: every step verifies a 512-node tree (the largest a service
// serves by default) and the output still equals speculation off.
TEST_F(DflashServiceTest, FiveHundredTwelveNodeTreesMatchPlainDecoding) {
  v1::GenerateRequest off = TextRequest(CodePrompts()[2], v1::SPECULATION_MODE_OFF, 12);
  const Outcome plain = Generate(verifier_->stub(), off);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  v1::GenerateRequest r = off;
  r.mutable_speculation()->set_mode(v1::SPECULATION_MODE_DFLASH);
  r.mutable_speculation()->set_tree_budget(512);
  const Outcome spec = Generate(verifier_->stub(), r);
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain.ids);
  const v1::SpeculationStats& stats = spec.last.speculation();
  EXPECT_EQ(stats.fallback_steps(), 0);
  ASSERT_GT(stats.steps(), 0);
  EXPECT_EQ(stats.drafted_tokens(), 512 * stats.steps());
}

// A prompt whose rows exceed one part (1 MiB: 1024 rows of this target's 2 x 256 bf16) reaches
// the drafter in parts, and the session drafts from all of them.
TEST_F(DflashServiceTest, ALongPromptsRowsTravelInParts) {
  v1::GenerateRequest r;
  std::vector<int32_t> ids;
  for (int i = 0; i < 1300; ++i) ids.push_back(3 + (i * 37) % 4000);
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  r.mutable_sampling()->set_max_new_tokens(8);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_speculation()->set_mode(v1::SPECULATION_MODE_OFF);
  const Outcome plain = Generate(verifier_->stub(), r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  r.mutable_speculation()->set_mode(v1::SPECULATION_MODE_DFLASH);
  const Outcome spec = Generate(verifier_->stub(), r);
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain.ids);
  EXPECT_GT(spec.last.speculation().drafted_tokens(), 0);
  EXPECT_EQ(spec.last.speculation().fallback_steps(), 0);
}

// A conversation's next turn with DFlash over real gRPC: the verifier reuses its cached prefix
// as far as the drafter holds that prefix's feature rows (DraftOpen.cached_tokens, answered in
// DraftOpened), computes and sends only the rest, and every step still drafts; the output
// equals speculation off. A turn whose history the drafter never saw (the first turn ran
// without speculation) has the two caches disagree: the verifier then computes the whole
// prompt again, features and all, and the output is still exact.
TEST_F(DflashServiceTest, ANextTurnReusesTheCachedPrefixOnBothSides) {
  for (const bool drafter_saw_it : {true, false}) {
    std::vector<int32_t> history;
    for (int i = 0; i < 150; ++i) history.push_back(3 + (i * 53 + (drafter_saw_it ? 0 : 7)) % 4000);
    v1::GenerateRequest first;
    first.mutable_token_ids()->mutable_ids()->Add(history.begin(), history.end());
    first.mutable_sampling()->set_max_new_tokens(20);
    first.mutable_sampling()->set_ignore_eos(true);
    first.mutable_speculation()->set_mode(drafter_saw_it ? v1::SPECULATION_MODE_DFLASH
                                                         : v1::SPECULATION_MODE_OFF);
    const Outcome one = Generate(verifier_->stub(), first);
    ASSERT_TRUE(one.status.ok()) << one.status.error_message();

    v1::GenerateRequest turn = first;
    turn.mutable_token_ids()->mutable_ids()->Add(one.ids.begin(), one.ids.end());
    for (int i = 0; i < 12; ++i) turn.mutable_token_ids()->add_ids(500 + i);
    turn.mutable_speculation()->set_mode(v1::SPECULATION_MODE_DFLASH);
    const Outcome two = Generate(verifier_->stub(), turn);
    ASSERT_TRUE(two.status.ok()) << two.status.error_message();
    const int cached = two.last.usage().cached_tokens();
    if (drafter_saw_it) {
      // The drafter's rows reach at least the first turn's prompt (its last rows may not have
      // gone into its model before the session ended).
      EXPECT_GE(cached, 144) << "in whole pages of 16";
    } else {
      EXPECT_EQ(cached, 0) << "the drafter holds none of the rows";
    }
    EXPECT_GT(two.last.speculation().drafted_tokens(), 0);
    EXPECT_EQ(two.last.speculation().fallback_steps(), 0) << "every step drafted";
    v1::GenerateRequest off = turn;
    off.mutable_speculation()->set_mode(v1::SPECULATION_MODE_OFF);
    const Outcome plain = Generate(verifier_->stub(), off);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    EXPECT_EQ(two.ids, plain.ids) << "drafter saw it " << drafter_saw_it;
  }
}

// The shipped drafter (models/tiny-dflash) loads from its checkpoint and drafts what the target
// then accepts: on held-out code, DDTree of 16 nodes accepts about three tokens a step (4.0 tokens
// per step over the 24 held-out prompts, bench/tau_sweep.sh), where a random drafter accepts
// none. Catches weights that load but are not the trained ones (a tensor mixed up, the wrong
// target layers).
class ShippedDflashServiceTest : public DflashServiceTest {
 protected:
  std::string DrafterDir() const override { return kRoot + "/models/tiny-dflash"; }
};

TEST_F(ShippedDflashServiceTest, TheShippedDrafterIsAcceptedAndMatchesPlainDecoding) {
  int64_t steps = 0, accepted = 0;
  for (const std::string& prompt : {CodePrompts()[0], CodePrompts()[1], CodePrompts()[2]}) {
    v1::GenerateRequest off = TextRequest(prompt, v1::SPECULATION_MODE_OFF, 48);
    const Outcome plain = Generate(verifier_->stub(), off);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    v1::GenerateRequest r = off;
    r.mutable_speculation()->set_mode(v1::SPECULATION_MODE_DFLASH);
    r.mutable_speculation()->set_tree_budget(16);
    const Outcome spec = Generate(verifier_->stub(), r);
    ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
    EXPECT_EQ(spec.ids, plain.ids);
    steps += spec.last.speculation().steps();
    accepted += spec.last.speculation().accepted_tokens();
  }
  ASSERT_GT(steps, 0);
  EXPECT_GT(static_cast<double>(accepted) / steps, 1.0)
      << accepted << " drafted tokens accepted in " << steps << " steps";
}

}  // namespace
}  // namespace treespec
