// The draft batcher: sessions drafting at the same time share batched forwards (and DFlash
// sessions their context appends), get the very trees they get alone (the CPU model's rows do
// not depend on their batch), a forward or append that fails for one session's entry fails
// only that session, and a backend that returns the wrong number of rows fails the job with
// INTERNAL instead of reading past its answer.
#include "drafter_service/draft_batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/backend/load_model.h"
#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/model/dtype.h"
#include "common/model/forwarding_causal_lm.h"
#include "drafter_service/dflash_drafter.h"
#include "drafter_service/draft_model_drafter.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

// Passes every call on; records each ForwardTopK's and AppendContext's batch size, holds the
// first of them back for a while (so the other sessions' jobs queue up behind it) and fails
// batches that hold `poison`.
class WatchedLm final : public ForwardingCausalLm {
 public:
  explicit WatchedLm(std::unique_ptr<CausalLm> lm) : ForwardingCausalLm(std::move(lm)) {}
  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ForwardTopK(
      absl::Span<const SeqTree> batch, int k, TopKRows rows) override {
    if (calls_++ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    largest_batch_ = std::max(largest_batch_.load(), static_cast<int>(batch.size()));
    for (const SeqTree& t : batch) {
      if (t.seq == poison_) return absl::ResourceExhaustedError("poisoned sequence");
    }
    auto ranked = ForwardingCausalLm::ForwardTopK(batch, k, rows);
    if (ranked.ok() && drop_row_ && !ranked->empty()) ranked->pop_back();  // a broken backend
    return ranked;
  }
  absl::Status AppendContext(absl::Span<const ContextRows> batch) override {
    if (calls_++ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    largest_append_ = std::max(largest_append_.load(), static_cast<int>(batch.size()));
    for (const ContextRows& e : batch) {
      if (e.seq == poison_) return absl::ResourceExhaustedError("poisoned sequence");
    }
    return ForwardingCausalLm::AppendContext(batch);
  }
  using ForwardingCausalLm::AppendContext;

  std::atomic<int> calls_{0}, largest_batch_{0}, largest_append_{0};
  std::atomic<SeqId> poison_{-1};
  std::atomic<bool> drop_row_{false};
};

std::unique_ptr<CausalLm> CpuLm(const ModelConfig& config) {
  LmOptions options;
  options.max_batch = 16;
  auto lm = CreateCpuCausalLm(config, testing::RandomWeights(config, 7), options);
  EXPECT_TRUE(lm.ok()) << lm.status();
  return *std::move(lm);
}

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % vocab);
  return out;
}

constexpr int kSessions = 8;

// Each of kSessions sessions appends its own prompt, then drafts three steps, all at once.
std::vector<std::vector<DraftedTree>> DraftTogether(DrafterFactory& factory, int vocab,
                                                    std::vector<absl::Status>* status) {
  std::vector<std::vector<DraftedTree>> trees(kSessions);
  status->assign(kSessions, absl::OkStatus());
  std::vector<std::thread> threads;
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      auto session = *factory.NewSession();
      absl::Status st = session->Append(TokenContext(Tokens(20 + s, vocab, 100 + s)));
      for (int step = 0; step < 3 && st.ok(); ++step) {
        absl::StatusOr<DraftedTree> tree = session->AppendAndDraft(
            TokenContext(Tokens(1 + step, vocab, 200 + s * 3 + step)), {12, 5});
        if (tree.ok()) {
          trees[s].push_back(*tree);
        } else {
          st = tree.status();
        }
      }
      (*status)[s] = st;
    });
  }
  for (std::thread& t : threads) t.join();
  return trees;
}

TEST(DraftBatcherTest, ConcurrentSessionsShareForwardsAndDraftWhatTheyDraftAlone) {
  const ModelConfig config = testing::SmallLlamaConfig();
  auto watched = std::make_unique<WatchedLm>(CpuLm(config));
  WatchedLm* const watch = watched.get();
  DraftModelDrafterFactory together(std::move(watched), DraftModelOptions());
  std::vector<absl::Status> status;
  const std::vector<std::vector<DraftedTree>> got =
      DraftTogether(together, config.vocab_size, &status);
  EXPECT_GT(watch->largest_batch_.load(), 1) << "no forward was shared between sessions";

  DraftModelDrafterFactory alone(CpuLm(config), DraftModelOptions());
  for (int s = 0; s < kSessions; ++s) {
    ASSERT_TRUE(status[s].ok()) << "session " << s << ": " << status[s];
    auto session = *alone.NewSession();
    ASSERT_TRUE(session->Append(TokenContext(Tokens(20 + s, config.vocab_size, 100 + s))).ok());
    ASSERT_EQ(got[s].size(), 3u);
    for (int step = 0; step < 3; ++step) {
      const DraftedTree want = *session->AppendAndDraft(
          TokenContext(Tokens(1 + step, config.vocab_size, 200 + s * 3 + step)), {12, 5});
      EXPECT_EQ(got[s][step].tokens, want.tokens) << "session " << s << " step " << step;
      EXPECT_EQ(got[s][step].parents, want.parents) << "session " << s << " step " << step;
      EXPECT_EQ(got[s][step].logprobs, want.logprobs) << "session " << s << " step " << step;
    }
  }
}

TEST(DraftBatcherTest, AFailingEntryFailsOnlyItsOwnSession) {
  const ModelConfig config = testing::SmallLlamaConfig();
  auto watched = std::make_unique<WatchedLm>(CpuLm(config));
  WatchedLm* const watch = watched.get();
  // Sequence ids are handed out in order from 1: the third session to open gets 3.
  watch->poison_ = 3;
  DraftModelDrafterFactory factory(std::move(watched), DraftModelOptions());
  std::vector<absl::Status> status;
  const std::vector<std::vector<DraftedTree>> got =
      DraftTogether(factory, config.vocab_size, &status);
  int failed = 0;
  for (int s = 0; s < kSessions; ++s) {
    if (status[s].ok()) {
      EXPECT_EQ(got[s].size(), 3u) << "session " << s;
      for (const DraftedTree& t : got[s]) EXPECT_FALSE(t.tokens.empty()) << "session " << s;
    } else {
      ++failed;
      EXPECT_EQ(status[s].code(), absl::StatusCode::kResourceExhausted) << status[s];
    }
  }
  EXPECT_EQ(failed, 1) << "exactly the poisoned session fails";
}

TEST(DraftBatcherTest, ABackendReturningTheWrongRowsIsAnErrorNotACrash) {
  const ModelConfig config = testing::SmallLlamaConfig();
  auto watched = std::make_unique<WatchedLm>(CpuLm(config));
  watched->calls_ = 1;  // no hold-back
  watched->drop_row_ = true;
  DraftModelDrafterFactory factory(std::move(watched), DraftModelOptions());
  auto session = *factory.NewSession();
  const absl::Status s = session->Append(TokenContext(Tokens(5, config.vocab_size, 1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("ranked rows"), absl::string_view::npos) << s;
}

DflashLm LoadDflash() {
  absl::StatusOr<DflashLm> d = LoadDflashLm(
      std::string(TREESPEC_SOURCE_DIR) + "/tests/data/models/dflash_random",
      std::string(TREESPEC_SOURCE_DIR) + "/models/tiny-target", "cpu", LmOptions{.max_batch = 16});
  EXPECT_TRUE(d.ok()) << d.status();
  return *std::move(d);
}

// Session s's context: n tokens and the feature rows of all but the last.
DraftContext DflashContext(int n, int width, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  DraftContext c{Tokens(n, vocab, seed), {}};
  c.features.rows = n - 1;
  c.features.width = width;
  for (int i = 0; i < (n - 1) * width; ++i) c.features.bf16.push_back(FloatToBf16Bits(normal(rng)));
  return c;
}

// DFlash sessions: each appends a prompt's rows and drafts, then appends one step's token and
// row and drafts again, all at once: their appends share calls, the trees are those each
// session drafts alone, and a session whose append fails fails alone.
TEST(DraftBatcherTest, DflashSessionsAppendTheirContextsTogether) {
  DflashLm d = LoadDflash();
  const int width = d.config.features().width(), vocab = d.config.body.vocab_size;
  auto watched = std::make_unique<WatchedLm>(std::move(d.lm));
  WatchedLm* const watch = watched.get();
  watch->poison_ = 3;  // the third session to open
  DflashDrafterFactory together(d.config, std::move(watched), DflashOptions());
  std::vector<std::vector<DraftedTree>> got(kSessions);
  std::vector<absl::Status> status(kSessions);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<DraftSession>> sessions;
  for (int s = 0; s < kSessions; ++s) sessions.push_back(*together.NewSession());
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      DraftSession& session = *sessions[s];
      absl::StatusOr<DraftedTree> tree =
          session.AppendAndDraft(DflashContext(10 + s, width, vocab, 100 + s), {12, 5});
      if (tree.ok()) {
        got[s].push_back(*tree);
        DraftContext step = DflashContext(2, width, vocab, 300 + s);
        step.tokens.erase(step.tokens.begin());  // one token, one row (the previous bonus's)
        tree = session.AppendAndDraft(step, {12, 5});
        if (tree.ok()) got[s].push_back(*tree);
      }
      status[s] = tree.status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(watch->largest_append_.load(), 1) << "no append was shared between sessions";

  DflashLm ref = LoadDflash();
  DflashDrafterFactory alone(ref.config, std::move(ref.lm), DflashOptions());
  for (int s = 0; s < kSessions; ++s) {
    SCOPED_TRACE(absl::StrCat("session ", s));
    if (s == 2) {
      EXPECT_EQ(status[s].code(), absl::StatusCode::kResourceExhausted) << status[s];
      continue;
    }
    ASSERT_TRUE(status[s].ok()) << status[s];
    auto session = *alone.NewSession();
    ASSERT_EQ(got[s].size(), 2u);
    const DraftedTree first =
        *session->AppendAndDraft(DflashContext(10 + s, width, vocab, 100 + s), {12, 5});
    DraftContext step = DflashContext(2, width, vocab, 300 + s);
    step.tokens.erase(step.tokens.begin());
    const DraftedTree second = *session->AppendAndDraft(step, {12, 5});
    EXPECT_EQ(got[s][0].tokens, first.tokens);
    EXPECT_EQ(got[s][0].logprobs, first.logprobs);
    EXPECT_EQ(got[s][1].tokens, second.tokens);
    EXPECT_EQ(got[s][1].parents, second.parents);
  }
}

}  // namespace
}  // namespace treespec
