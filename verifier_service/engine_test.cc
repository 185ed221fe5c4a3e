// Engine invariants on a random model: speculation never changes the output (greedy and seeded
// sampling, any drafter, any tree), a batch equals its requests alone, cancel frees the KV
// cache, and bad or missing drafts fail open.
#include "verifier_service/engine.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/ngram_drafter.h"
#include "drafter_service/replay_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "verifier_service/engine_test_util.h"

namespace treespec {
namespace {

using testing::DelayedDraftSource;
using ::testing::ElementsAreArray;
using testing::LocalDraftSource;
using testing::RecordingFactory;
using testing::RecordingSink;
using testing::RunToEnd;
using testing::ScriptedDraftSource;
using testing::StatedPoolSource;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_dir_ = new std::string(testing::WriteTempModel(testing::SmallConfig(), 7));
    ModelConfig draft_config = testing::SmallConfig();
    draft_config.num_layers = 1;
    draft_dir_ = new std::string(testing::WriteTempModel(draft_config, 8));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*target_dir_);
    std::filesystem::remove_all(*draft_dir_);
  }

  void SetUp() override {
    ASSERT_FALSE(target_dir_->empty());
    LmOptions lm;
    lm.max_batch = 8;
    auto model = LoadCpuCausalLm(*target_dir_, lm);
    ASSERT_TRUE(model.ok()) << model.status();
    target_ = *std::move(model);
  }

  // A prompt with repetition so the ngram drafter finds matches.
  static std::vector<int32_t> Prompt(int seed, int len = 40) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(3 + rng() % 40);
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin(), p.begin() + len / 2);
    return twice;
  }

  static GenerationRequest Request(std::vector<int32_t> prompt, SpecMode mode, int max_new = 48) {
    GenerationRequest r;
    r.id = "test";
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new;
    r.spec_mode = mode;
    r.ignore_eos = true;
    return r;
  }

  std::vector<int32_t> Plain(const GenerationRequest& request) {
    Engine engine(target_.get(), nullptr, nullptr, EngineOptions());
    GenerationRequest r = request;
    r.spec_mode = SpecMode::Off();
    GenerationUpdate out = RunToEnd(engine, r);
    EXPECT_TRUE(out.status.ok()) << out.status;
    return out.token_ids;
  }

  // A drafter that drafts with the target itself (its greedy path is accepted: long accepts).
  static std::unique_ptr<DraftModelDrafterFactory> SelfDrafter(DraftShape shape) {
    LmOptions lm;
    lm.max_batch = 4;
    auto self = LoadCpuCausalLm(*target_dir_, lm);
    EXPECT_TRUE(self.ok()) << self.status();
    if (!self.ok()) return nullptr;
    DraftModelOptions options;
    options.shape = shape;
    return std::make_unique<DraftModelDrafterFactory>(*std::move(self), options);
  }

  // `got`, what a drafting session's context was given, is a prefix of `context` (the prompt,
  // then the output) with a row for each token but the last: the target's features of layers
  // `layers`, as a plain prefill of those tokens captures them.
  void ExpectTheFeaturesOfAPrefill(const DraftContext& got, const std::vector<int32_t>& context,
                                   const std::vector<int>& layers) {
    const int hidden = target_->config().hidden_size;
    const int tokens = static_cast<int>(got.tokens.size());
    ASSERT_LE(got.tokens.size(), context.size());
    ASSERT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), context.begin()));
    ASSERT_EQ(got.features.rows, tokens - 1);
    ASSERT_EQ(got.features.width, static_cast<int>(layers.size()) * hidden);
    LmOptions lm;
    lm.max_batch = 4;
    auto reference_model = LoadCpuCausalLm(*target_dir_, lm);
    ASSERT_TRUE(reference_model.ok()) << reference_model.status();
    CausalLm& ref = **reference_model;
    ASSERT_TRUE(ref.SetFeatureLayers(layers).ok());
    SeqTree chain;
    chain.seq = ref.CreateSequence();
    chain.tokens.assign(got.tokens.begin(), got.tokens.end() - 1);
    for (int i = 0; i < tokens - 1; ++i) chain.parents.push_back(i - 1);
    StepSpec spec;
    spec.prefill = true;
    spec.capture_features = true;
    auto step = ref.VerifyStep({chain}, {spec});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_LE(testing::WorstFeatureError(got.features, (*step)[0].features, hidden), 0.02);
  }

  static std::string* target_dir_;
  static std::string* draft_dir_;
  std::unique_ptr<CausalLm> target_;
};

std::string* EngineTest::target_dir_ = nullptr;
std::string* EngineTest::draft_dir_ = nullptr;

TEST_F(EngineTest, PlainDecodingIsDeterministicAndFullLength) {
  GenerationRequest r = Request(Prompt(1), SpecMode::Off());
  const std::vector<int32_t> a = Plain(r);
  const std::vector<int32_t> b = Plain(r);
  EXPECT_EQ(a.size(), 48u);
  EXPECT_EQ(a, b);
}

// Speculation off counts its verify steps as every mode does (each without a draft): a 48-token
// request runs 47 after prefill, mean acceptance length 1.0, no drafts.
TEST_F(EngineTest, SpeculationOffCountsItsSteps) {
  Engine engine(target_.get(), nullptr, nullptr, EngineOptions());
  const GenerationUpdate out = RunToEnd(engine, Request(Prompt(1), SpecMode::Off()));
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.stats.steps, 47);
  EXPECT_EQ(out.stats.fallback_steps, 47);
  EXPECT_EQ(out.stats.drafted_tokens, 0);
  EXPECT_DOUBLE_EQ(out.stats.MeanAcceptanceLength(), 1.0);
}

// A request that set no max_new_tokens and fills the context ends with CONTEXT; one that asked
// for exactly the room left ends with LENGTH, its own limit.
TEST_F(EngineTest, AnUnsetLengthThatFillsTheContextEndsWithContext) {
  EngineOptions options;
  options.context_length = 100;
  Engine engine(target_.get(), nullptr, nullptr, options);
  GenerationRequest unset = Request(Prompt(2), SpecMode::Off());  // 60 prompt tokens
  unset.max_new_tokens.reset();
  GenerationUpdate out = RunToEnd(engine, unset);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.finish_reason, FinishReason::kContext);
  EXPECT_EQ(out.completion_tokens, 40);
  out = RunToEnd(engine, Request(Prompt(2), SpecMode::Off(), 40));
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.completion_tokens, 40);
}

// Greedy and seeded sampling, with the ngram drafter at several budgets and depths.
TEST_F(EngineTest, NgramSpeculationMatchesPlain) {
  NgramDrafterFactory factory{NgramOptions()};
  LocalDraftSource drafts(&factory);
  for (float temperature : {0.0f, 0.8f}) {
    for (int budget : {1, 4, 16}) {
      for (int seed : {1, 2}) {
        GenerationRequest r = Request(Prompt(seed), SpecMode::Of(DrafterKind::kNgram));
        r.sampling.temperature = temperature;
        r.sampling.seed = 1234 + seed;
        r.top_p = 0.9f;
        r.spec.tree_budget = budget;
        r.spec.max_depth = 6;
        const std::vector<int32_t> plain = Plain(r);
        Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
        GenerationUpdate spec = RunToEnd(engine, r);
        ASSERT_TRUE(spec.status.ok()) << spec.status;
        EXPECT_THAT(spec.token_ids, ElementsAreArray(plain))
            << "temperature " << temperature << " budget " << budget << " seed " << seed;
        EXPECT_GT(spec.stats.steps, 0);
      }
    }
  }
}

// The draft model equal to the target accepts (nearly) everything: deep paths get committed.
TEST_F(EngineTest, DraftModelSpeculationMatchesPlainChainAndTree) {
  for (const std::string* dir : {target_dir_, draft_dir_}) {
    for (bool tree : {false, true}) {
      LmOptions lm;
      lm.max_batch = 4;
      auto draft = LoadCpuCausalLm(*dir, lm);
      ASSERT_TRUE(draft.ok()) << draft.status();
      DraftModelOptions options;
      options.shape = tree ? DraftShape::kTree : DraftShape::kChain;
      DraftModelDrafterFactory factory(*std::move(draft), options);
      LocalDraftSource drafts(&factory);
      for (float temperature : {0.0f, 0.7f}) {
        GenerationRequest r = Request(Prompt(3), SpecMode::Of(DrafterKind::kDraftModel));
        r.sampling.temperature = temperature;
        r.sampling.seed = 99;
        r.spec.tree_budget = tree ? 12 : 6;
        r.spec.max_depth = 6;
        const std::vector<int32_t> plain = Plain(r);
        Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
        GenerationUpdate spec = RunToEnd(engine, r);
        ASSERT_TRUE(spec.status.ok()) << spec.status;
        EXPECT_THAT(spec.token_ids, ElementsAreArray(plain))
            << "tree " << tree << " temperature " << temperature;
        if (dir == target_dir_ && temperature == 0.0f) {
          // Self-drafting: the greedy chain is always the target's own choice. A tree spends
          // its budget on the likeliest prefixes, which on this flat random model are mostly
          // shallow siblings, but its greedy path is still accepted whole.
          EXPECT_GT(spec.stats.MeanAcceptanceLength(), tree ? 1.5 : 4.0) << "tree " << tree;
        }
      }
    }
  }
}

// The prefix cache: a conversation's next turn (the previous prompt, its answer, new text)
// reuses the cached pages of what came before and prefills only the rest, and its output is
// the cold output token for token — speculation off and on, greedy and sampled. A prompt that
// is cached whole, or ends on a page boundary, still computes its last token.
TEST_F(EngineTest, PrefixCacheHitsGiveTheColdOutput) {
  NgramDrafterFactory ngram{NgramOptions()};
  LocalDraftSource drafts(&ngram);
  EngineOptions cold_options;
  cold_options.prefix_cache = false;
  for (const SpecMode mode : {SpecMode::Off(), SpecMode::Of(DrafterKind::kNgram)}) {
    for (float temperature : {0.0f, 0.8f}) {
      LmOptions lm;
      lm.max_batch = 4;
      auto fresh = LoadCpuCausalLm(*target_dir_, lm);
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      Engine warm(fresh->get(), nullptr, &drafts, EngineOptions());
      GenerationRequest first = Request(Prompt(7), mode, 40);  // 60 prompt tokens
      first.sampling.temperature = temperature;
      first.sampling.seed = 5;
      const GenerationUpdate one = RunToEnd(warm, first);
      ASSERT_TRUE(one.status.ok()) << one.status;
      EXPECT_EQ(one.cached_tokens, 0);

      GenerationRequest turn = first;
      turn.prompt.insert(turn.prompt.end(), one.token_ids.begin(), one.token_ids.end());
      for (int32_t t : Prompt(8, 10)) turn.prompt.push_back(t);
      const int page = (*fresh)->kv_cache().page_size();
      for (const GenerationRequest& r : {turn, first}) {
        const GenerationUpdate hit = RunToEnd(warm, r);
        ASSERT_TRUE(hit.status.ok()) << hit.status;
        // Every full page of the first turn's committed tokens (its prompt and all but its
        // last token) is reused; a prompt cached whole keeps its last page's token to compute.
        const int reusable = static_cast<int>(r.prompt.size()) == 60 ? (60 - 1) / page * page
                                                                     : (60 + 40 - 1) / page * page;
        EXPECT_EQ(hit.cached_tokens, reusable) << "prompt " << r.prompt.size();
        Engine cold(target_.get(), nullptr, &drafts, cold_options);
        const GenerationUpdate want = RunToEnd(cold, r);
        ASSERT_TRUE(want.status.ok()) << want.status;
        EXPECT_EQ(want.cached_tokens, 0);
        EXPECT_THAT(hit.token_ids, ElementsAreArray(want.token_ids))
            << "speculation " << !mode.off() << " temperature " << temperature << " prompt "
            << r.prompt.size();
      }
    }
  }
}

// Records like RecordingSink and calls `hook(n)` after its n-th update, on the engine thread
// (so what the hook does happens between two steps, at a known point of the stream).
class HookedSink final : public RequestSink {
 public:
  explicit HookedSink(std::function<void(int)> hook) : hook_(std::move(hook)) {}
  void OnUpdate(GenerationUpdate update) override {
    record_.OnUpdate(std::move(update));
    hook_(record_.updates());
  }
  RecordingSink& record() { return record_; }

 private:
  std::function<void(int)> hook_;
  RecordingSink record_;
};

// Chunked prefill: a prompt computed in chunks of any size, cold or after a cached prefix,
// gives the output of the prompt computed whole in one step, bit for bit on the CPU (its rows
// are batch-invariant) — speculation off and on, greedy and sampled; the chunks end at
// multiples of the chunk size whatever the cached prefix.
TEST_F(EngineTest, ChunkedPrefillGivesTheOutputOfAWholePrefill) {
  NgramDrafterFactory ngram{NgramOptions()};
  LocalDraftSource drafts(&ngram);
  EngineOptions whole;
  whole.prefill_chunk = 0;
  whole.prefix_cache = false;
  Engine reference(target_.get(), nullptr, &drafts, whole);
  for (const SpecMode mode : {SpecMode::Off(), SpecMode::Of(DrafterKind::kNgram)}) {
    for (float temperature : {0.0f, 0.8f}) {
      GenerationRequest first = Request(Prompt(21, 50), mode, 30);  // 75 prompt tokens
      first.sampling.temperature = temperature;
      first.sampling.seed = 3;
      const GenerationUpdate want_first = RunToEnd(reference, first);
      ASSERT_TRUE(want_first.status.ok()) << want_first.status;
      GenerationRequest turn = first;
      turn.prompt.insert(turn.prompt.end(), want_first.token_ids.begin(),
                         want_first.token_ids.end());
      for (int32_t t : Prompt(22, 10)) turn.prompt.push_back(t);
      const GenerationUpdate want_turn = RunToEnd(reference, turn);
      ASSERT_TRUE(want_turn.status.ok()) << want_turn.status;
      for (int chunk : {1, 5, 16, 37}) {
        for (bool cache : {false, true}) {
          LmOptions lm;
          lm.max_batch = 4;
          auto fresh = LoadCpuCausalLm(*target_dir_, lm);
          ASSERT_TRUE(fresh.ok()) << fresh.status();
          EngineOptions o;
          o.prefill_chunk = chunk;
          o.prefix_cache = cache;
          Engine engine(fresh->get(), nullptr, &drafts, o);
          const std::string where = absl::StrCat("speculation ", !mode.off(), " temperature ",
                                                 temperature, " chunk ", chunk, " cache ", cache);
          int64_t chunks = 0;
          for (const auto& [r, want] : {std::pair{&first, &want_first}, {&turn, &want_turn}}) {
            const GenerationUpdate got = RunToEnd(engine, *r);
            ASSERT_TRUE(got.status.ok()) << got.status;
            EXPECT_THAT(got.token_ids, ElementsAreArray(want->token_ids)) << where;
            // Chunks end at multiples of the chunk size: [c, P) after c cached tokens.
            const int prompt = static_cast<int>(r->prompt.size());
            chunks += (prompt + chunk - 1) / chunk - got.cached_tokens / chunk;
            EXPECT_EQ(engine.Snapshot().prefill_chunks, chunks) << where;
            if (r == &turn) EXPECT_EQ(got.cached_tokens > 0, cache) << where;
          }
        }
      }
    }
  }
}

// While a long prompt prefills in chunks, a running stream gets a token every step: one per
// chunk, where a whole prefill is one step (the stream's gap is the whole prefill).
TEST_F(EngineTest, RunningStreamsKeepDecodingWhileALongPromptPrefills) {
  const GenerationRequest long_prompt = Request(Prompt(31, 200), SpecMode::Off(), 8);  // 300
  const std::vector<int32_t> want = Plain(long_prompt);
  for (int chunk : {0, 16}) {
    EngineOptions o;
    o.prefill_chunk = chunk;
    o.prefix_cache = false;  // the long prompt is computed whole each time
    Engine engine(target_.get(), nullptr, nullptr, o);
    std::shared_ptr<HookedSink> running;
    int running_updates_before_first_token = -1;
    auto long_sink = std::make_shared<HookedSink>([&](int n) {
      if (n == 1) running_updates_before_first_token = running->record().updates();
    });
    // The long prompt arrives right after the running stream's third token (between steps).
    running = std::make_shared<HookedSink>([&](int n) {
      if (n == 3) ASSERT_TRUE(engine.Submit(long_prompt, long_sink).ok());
    });
    ASSERT_TRUE(engine.Submit(Request(Prompt(30), SpecMode::Off(), 100), running).ok());
    ASSERT_TRUE(running->record().Wait());
    ASSERT_TRUE(long_sink->record().Wait());
    EXPECT_THAT(long_sink->record().ids(), ElementsAreArray(want)) << "chunk " << chunk;
    // Each step the running stream is in computes one chunk (its token comes first).
    auto chunks_of = [&](int prompt) { return chunk > 0 ? (prompt + chunk - 1) / chunk : 1; };
    const int steps = chunks_of(300);
    EXPECT_EQ(running_updates_before_first_token - 3, steps) << "chunk " << chunk;
    EXPECT_EQ(engine.Snapshot().prefill_chunks, chunks_of(60) + steps);
  }
}

// A request cancelled halfway through its chunked prefill frees its pages, leaves the chunks
// it computed cached, and the same prompt later reuses them and gives the cold output.
TEST_F(EngineTest, CancelMidPrefillFreesPagesAndKeepsTheComputedChunks) {
  LmOptions lm;
  lm.max_batch = 4;
  auto model = LoadCpuCausalLm(*target_dir_, lm);
  ASSERT_TRUE(model.ok()) << model.status();
  PagedKvCache& kv = (*model)->kv_cache();
  EngineOptions o;
  o.prefill_chunk = 16;
  Engine engine(model->get(), nullptr, nullptr, o);
  const GenerationRequest long_prompt = Request(Prompt(41, 200), SpecMode::Off(), 8);
  auto long_sink = std::make_shared<RecordingSink>();
  uint64_t handle = 0;
  auto running = std::make_shared<HookedSink>([&](int n) {
    if (n == 3) handle = *engine.Submit(long_prompt, long_sink);
    if (n == 7) engine.Cancel(handle);  // 4 chunks in (steps 4..7)
  });
  const GenerationRequest stream = Request(Prompt(40), SpecMode::Off(), 20);
  ASSERT_TRUE(engine.Submit(stream, running).ok());
  ASSERT_TRUE(running->record().Wait());
  ASSERT_TRUE(engine.WaitIdle(absl::Seconds(60)));
  EXPECT_EQ(long_sink->updates(), 0);  // a cancelled request gets no more updates
  EXPECT_EQ(kv.free_pages(), kv.num_pages());
  EXPECT_GE(kv.cached_pages(), 4);

  const GenerationUpdate again = RunToEnd(engine, long_prompt);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.cached_tokens, 64);
  EXPECT_THAT(again.token_ids, ElementsAreArray(Plain(long_prompt)));
}

// More distinct prefixes than the pool holds: every request completes, cached pages are
// evicted for new ones, and a held page never is (requests sharing a prefix run together).
TEST_F(EngineTest, PrefixCacheUnderPagePressureCompletesEveryRequest) {
  LmOptions lm;
  lm.max_batch = 4;
  lm.kv_pages = 24;  // 384 slots; each request takes up to 6 pages
  auto model = LoadCpuCausalLm(*target_dir_, lm);
  ASSERT_TRUE(model.ok()) << model.status();
  Engine engine(model->get(), nullptr, nullptr, EngineOptions());
  Engine cold(target_.get(), nullptr, nullptr, [] {
    EngineOptions o;
    o.prefix_cache = false;
    return o;
  }());
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 12; ++i) {
    // Pairs of requests share a 48-token prefix; the pairs differ.
    GenerationRequest r = Request(Prompt(100 + i / 2, 32), SpecMode::Off(), 24);
    r.prompt.push_back(3 + i);
    r.id = absl::StrCat("r", i);
    requests.push_back(r);
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(engine.Submit(r, sinks.back()).ok());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait()) << i;
    const GenerationUpdate last = sinks[i]->final_update();
    ASSERT_TRUE(last.status.ok()) << i << ": " << last.status;
    EXPECT_THAT(sinks[i]->ids(), ElementsAreArray(RunToEnd(cold, requests[i]).token_ids)) << i;
  }
  EXPECT_LE((*model)->kv_cache().cached_pages(), 24);
  EXPECT_EQ((*model)->kv_cache().free_pages(), 24);  // all released, the cached ones evictable
}

// An MLA + MoE target (DeepSeek-V3's blocks): speculation with the ngram drafter and with the
// target drafting for itself (its latent KV cache on both sides) equals speculation off, greedy
// and sampled; self-drafting's greedy chain is accepted whole.
TEST_F(EngineTest, MlaMoeTargetSpeculationMatchesPlain) {
  ModelConfig config = testing::SmallDeepseekConfig();
  config.max_position_embeddings = 512;
  const std::string dir = testing::WriteTempModel(config, 11);
  ASSERT_FALSE(dir.empty());
  LmOptions lm;
  lm.max_batch = 4;
  auto target = LoadCpuCausalLm(dir, lm);
  ASSERT_TRUE(target.ok()) << target.status();
  auto self = LoadCpuCausalLm(dir, lm);
  ASSERT_TRUE(self.ok()) << self.status();
  std::filesystem::remove_all(dir);
  DraftModelOptions self_options;
  self_options.shape = DraftShape::kChain;
  DraftModelDrafterFactory self_factory(*std::move(self), self_options);
  NgramDrafterFactory ngram_factory{NgramOptions()};
  LocalDraftSource self_drafts(&self_factory), ngram_drafts(&ngram_factory);
  const struct {
    DraftSource* drafts;
    DrafterKind kind;
  } drafters[] = {{&ngram_drafts, DrafterKind::kNgram}, {&self_drafts, DrafterKind::kDraftModel}};
  for (const auto& d : drafters) {
    for (float temperature : {0.0f, 0.8f}) {
      GenerationRequest r = Request(Prompt(4), SpecMode::Of(d.kind), 32);
      r.sampling.temperature = temperature;
      r.sampling.seed = 77;
      r.spec.tree_budget = 8;
      r.spec.max_depth = 6;
      Engine plain_engine(target->get(), nullptr, nullptr, EngineOptions());
      GenerationRequest off = r;
      off.spec_mode = SpecMode::Off();
      const GenerationUpdate plain = RunToEnd(plain_engine, off);
      ASSERT_TRUE(plain.status.ok()) << plain.status;
      Engine engine(target->get(), nullptr, d.drafts, EngineOptions());
      const GenerationUpdate spec = RunToEnd(engine, r);
      ASSERT_TRUE(spec.status.ok()) << spec.status;
      EXPECT_THAT(spec.token_ids, ElementsAreArray(plain.token_ids))
          << DrafterKindName(d.kind) << " temperature " << temperature;
      if (d.kind == DrafterKind::kDraftModel && temperature == 0.0f) {
        EXPECT_GT(spec.stats.MeanAcceptanceLength(), 4.0);
      }
    }
  }
}

// A step-cost model is scored against every verify step and refreshed from it: one that
// predicts a second per step sees every step far faster (the lowest ratio bucket) and moves its
// predictions down as steps are observed; the output is the same as without one.
TEST_F(EngineTest, TheStepCostModelIsScoredAndRefreshedByEveryVerifyStep) {
  const StepCostGrid grid{{1, 8}, {0, 16}, {0, 256}};
  absl::StatusOr<StepCostModel> slow =
      StepCostModel::Create(grid, std::vector<double>(grid.size(), 1000.0));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EngineOptions options;
  options.step_cost = *slow;
  NgramDrafterFactory factory{NgramOptions()};
  LocalDraftSource drafts(&factory);
  Engine engine(target_.get(), nullptr, &drafts, options);
  const GenerationRequest r = Request(Prompt(2), SpecMode::Of(DrafterKind::kNgram));
  const GenerationUpdate out = RunToEnd(engine, r);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(out.token_ids, ElementsAreArray(Plain(r)));
  const std::optional<StepCostStats> stats = engine.Snapshot().step_cost;
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->steps, out.stats.steps) << "every step after the prefill";
  EXPECT_EQ(stats->ratio_counts[0], stats->steps);
  EXPECT_GT(stats->measured_ms, 0);
  EXPECT_LT(stats->predicted_ms, 0.9 * 1000.0 * static_cast<double>(stats->steps))
      << "the predictions come down toward the measured times";
  EXPECT_FALSE(Engine(target_.get(), nullptr, nullptr, EngineOptions()).Snapshot().step_cost)
      << "no model, no figures";
}

// A step that costs 1 ms plus `per_node` ms per drafted node per sequence.
StepCostModel LinearStepCost(double per_node) {
  const StepCostGrid grid{{1, 8}, {0, 64}, {0, 4096}};
  std::vector<double> ms(grid.size());
  for (size_t b = 0; b < 2; ++b) {
    for (size_t d = 0; d < 2; ++d) {
      for (size_t c = 0; c < 2; ++c) ms[grid.Index(b, d, c)] = 1 + per_node * grid.drafted[d];
    }
  }
  return *StepCostModel::Create(grid, ms);
}

// With a step-cost model the engine verifies only the drafted nodes that pay: all of them when
// nodes are free, none when a node costs as much as a step; either way the output is plain
// decoding's. A request that left its tree budget unset asks its drafter for more nodes while
// all of them pay (up to the largest served) and for a couple when none does. (The target
// drafts for itself, so its greedy path is accepted.)
TEST_F(EngineTest, AStepCostModelChoosesWhichDraftedNodesAreVerified) {
  const auto factory = SelfDrafter(DraftShape::kTree);
  ASSERT_NE(factory, nullptr);
  LocalDraftSource drafts(factory.get());
  GenerationRequest r = Request(Prompt(4), SpecMode::Of(DrafterKind::kDraftModel), 32);
  const std::vector<int32_t> plain = Plain(r);
  struct Run {
    GenerationUpdate out;
    SelectionCounts stats;  // the draft model's: every count is that kind's
    int64_t steps = 0;
  };
  auto run = [&](double per_node, int tree_budget) {
    EngineOptions options;
    options.spec.max = {40, 8, 40};
    options.step_cost = LinearStepCost(per_node);
    options.speculation_gate = false;  // the target drafting for itself never pays in time
    Engine engine(target_.get(), nullptr, &drafts, options);
    GenerationRequest request = r;
    request.spec.tree_budget = tree_budget;
    Run result{RunToEnd(engine, request), {}};
    StepCostStats stats = engine.Snapshot().step_cost.value();
    result.stats = stats.Of(DrafterKind::kDraftModel);
    result.steps = stats.steps;
    EXPECT_EQ(stats.Total().drafted_nodes, result.stats.drafted_nodes);
    EXPECT_EQ(stats.Total().accepted, result.stats.accepted);
    return result;
  };

  const Run cheap = run(0, 0);
  ASSERT_TRUE(cheap.out.status.ok()) << cheap.out.status;
  EXPECT_THAT(cheap.out.token_ids, ElementsAreArray(plain));
  EXPECT_EQ(cheap.stats.verified_nodes, cheap.stats.drafted_nodes) << "every node pays";
  EXPECT_GT(cheap.stats.drafted_nodes, 30 * cheap.steps)
      << "an auto budget grows from the default 16 to the largest served, 40";
  EXPECT_GT(cheap.stats.accepted, 0);
  EXPECT_GT(cheap.stats.expected_accepted, 0);

  const Run capped = run(0, 8);
  ASSERT_TRUE(capped.out.status.ok()) << capped.out.status;
  EXPECT_THAT(capped.out.token_ids, ElementsAreArray(plain));
  EXPECT_LE(capped.stats.drafted_nodes, 8 * capped.steps) << "a budget set is a cap";

  const Run saturated = run(10, 0);
  ASSERT_TRUE(saturated.out.status.ok()) << saturated.out.status;
  EXPECT_THAT(saturated.out.token_ids, ElementsAreArray(plain));
  EXPECT_EQ(saturated.stats.verified_nodes, 0) << "no node is worth a step";
  EXPECT_EQ(saturated.stats.accepted, 0);
  EXPECT_DOUBLE_EQ(saturated.out.stats.MeanAcceptanceLength(), 1.0);
  EXPECT_LE(saturated.stats.drafted_nodes, 16 + 2 * saturated.steps)
      << "after the first tree the drafter is asked for two nodes";
}

// The speculation gate scores each choice by what it delivers in time. A drafter whose trees
// take 100 ms to arrive (at most 3 tokens each) loses to plain steps by far: after its trial
// steps an auto request asks for no tree. Instant trees that are always accepted (the replay
// drafter on the target's own output) are tried, verified and accepted whole. Both outputs are
// plain decoding's. (Which arm wins a close race depends on wall time, which a loaded machine
// disturbs: speculation_gate_test covers that with a simulated clock.)
TEST_F(EngineTest, TheSpeculationGateAsksForTreesOnlyWhereTheyPay) {
  GenerationRequest r = Request(Prompt(6), SpecMode::Of(DrafterKind::kNgram), 200);
  r.spec.max_depth = 2;
  const std::vector<int32_t> plain = Plain(r);
  EngineOptions options;
  options.step_cost = LinearStepCost(0);
  options.draft_timeout = absl::Seconds(2);
  {
    NgramDrafterFactory ngram{NgramOptions()};
    DelayedDraftSource slow(&ngram, [](int64_t) { return absl::Milliseconds(100); });
    Engine engine(target_.get(), nullptr, &slow, options);
    const GenerationUpdate out = RunToEnd(engine, r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_THAT(out.token_ids, ElementsAreArray(plain));
    const SelectionCounts stats = engine.Snapshot().step_cost->Of(DrafterKind::kNgram);
    EXPECT_LE(stats.auto_tree_steps, SpeculationGate::EpochSteps(1) + 1);
    EXPECT_GT(stats.auto_plain_steps, 8 * stats.auto_tree_steps);
  }
  {
    std::vector<int32_t> record = r.prompt;
    record.insert(record.end(), plain.begin(), plain.end());
    ReplayDrafterFactory replay(
        std::make_shared<const ReplayRecords>(std::vector<std::vector<int32_t>>{record}),
        ReplayOptions{0.0, 1, 0});
    LocalDraftSource fast(&replay);
    GenerationRequest chains = r;
    chains.spec_mode = SpecMode::Of(DrafterKind::kReplay);
    chains.spec.max_depth = 8;
    Engine engine(target_.get(), nullptr, &fast, options);
    const GenerationUpdate out = RunToEnd(engine, chains);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_THAT(out.token_ids, ElementsAreArray(plain));
    const SelectionCounts stats = engine.Snapshot().step_cost->Of(DrafterKind::kReplay);
    EXPECT_GE(stats.auto_tree_steps, SpeculationGate::EpochSteps(1));
    EXPECT_EQ(stats.accepted, stats.verified_nodes) << "the target's own output, whole";
    EXPECT_GT(stats.accepted, 0);
  }
}

// A gated auto request opens its drafting session only when a tree is asked for, or when its
// deferred context reaches Engine::kMaxDeferredTokens: while the gate keeps a load plain, a short
// request costs the drafter nothing, not even its prompt's prefill, and a longer one's session
// is sent its whole context at once. A kind that takes target features is not even captured on
// plain steps: such a request, once plain without a session, stays plain and never opens one.
TEST_F(EngineTest, AGatedRequestOpensItsDraftSessionOnlyWhenItsContextIsDue) {
  const ModelConfig& c = target_->config();
  const auto self = SelfDrafter(DraftShape::kChain);
  ASSERT_NE(self, nullptr);
  for (const bool features : {false, true}) {
    const DrafterKind kind = features ? DrafterKind::kDflash : DrafterKind::kDraftModel;
    const FeatureSpec reads =
        features ? FeatureSpec{{1}, c.hidden_size, c.num_layers, c.vocab_size} : FeatureSpec{};
    RecordingFactory recording(self.get(), reads);
    DrafterPoolInfo pool{1, SpecLimits{16, 8, 16}, {kind}};
    pool.default_kind = kind;
    if (features) pool.feature_needs = {{kind, reads}};
    // Trees 100 ms late: after its tree epoch the gate keeps load 1 plain.
    DelayedDraftSource slow(
        &recording, [](int64_t) { return absl::Milliseconds(100); }, pool);
    EngineOptions options;
    options.step_cost = LinearStepCost(0);
    options.draft_timeout = absl::Seconds(2);
    Engine engine(target_.get(), nullptr, &slow, options);
    GenerationRequest teach = Request(Prompt(3), SpecMode::Auto(), 60);
    teach.spec.max_depth = 2;
    ASSERT_TRUE(RunToEnd(engine, teach).status.ok());
    ASSERT_EQ(slow.opened(), 1);
    ASSERT_GT(engine.Snapshot().step_cost->Of(std::nullopt).auto_plain_steps, 0) << "auto sessions";

    GenerationRequest shorter =
        Request(Prompt(4), SpecMode::Auto(), Engine::kMaxDeferredTokens - 1);
    const GenerationUpdate short_out = RunToEnd(engine, shorter);
    ASSERT_TRUE(short_out.status.ok()) << short_out.status;
    EXPECT_THAT(short_out.token_ids, ElementsAreArray(Plain(shorter)));
    EXPECT_EQ(slow.opened(), 1) << "a plain request that ends before its context is due";

    GenerationRequest longer = Request(Prompt(5), SpecMode::Auto(), 100);
    const GenerationUpdate long_out = RunToEnd(engine, longer);
    ASSERT_TRUE(long_out.status.ok()) << long_out.status;
    EXPECT_THAT(long_out.token_ids, ElementsAreArray(Plain(longer)));
    if (features) {
      EXPECT_EQ(slow.opened(), 1) << "no features were captured: no session";
      continue;
    }
    EXPECT_EQ(slow.opened(), 2);
    const DraftContext& got = recording.log();
    ASSERT_EQ(got.tokens.size(), longer.prompt.size() + Engine::kMaxDeferredTokens);
    std::vector<int32_t> context = longer.prompt;
    context.insert(context.end(), long_out.token_ids.begin(), long_out.token_ids.end());
    EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), context.begin()));
    EXPECT_TRUE(got.features.empty());
  }
}

TEST_F(EngineTest, BatchEqualsRequestsAlone) {
  NgramDrafterFactory factory{NgramOptions()};
  LocalDraftSource drafts(&factory);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r =
        Request(Prompt(10 + i, 20 + 7 * i),
                i % 2 ? SpecMode::Of(DrafterKind::kNgram) : SpecMode::Off(), 30 + 5 * i);
    r.sampling.temperature = i == 4 ? 0.9f : 0.0f;
    r.sampling.seed = i;
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(Plain(r));

  Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (auto r : requests) {
    ASSERT_TRUE(engine.Validate(r).ok());
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(engine.Submit(r, sink).ok());
    sinks.push_back(sink);
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_THAT(sinks[i]->ids(), ElementsAreArray(alone[i])) << "request " << i;
  }
}

// The whole loop (prefill, trees, walk, commit) at TP = 2, 3, 7 gives TP = 1's tokens; the
// model-level test bounds the logit differences (the sums run in another order). The prompt is
// prefilled in chunks on every rank, and a next turn served from the prefix cache (one page table
// for all ranks) gives what the same ranks give it cold.
TEST_F(EngineTest, TensorParallelMatchesSingleRank) {
  NgramDrafterFactory factory{NgramOptions()};
  LocalDraftSource drafts(&factory);
  GenerationRequest r = Request(Prompt(21), SpecMode::Of(DrafterKind::kNgram));
  const std::vector<int32_t> plain = Plain(r);
  for (int tp : {2, 3, 7}) {
    LmOptions lm;
    lm.tensor_parallel = tp;
    lm.max_batch = 4;
    auto model = LoadCpuCausalLm(*target_dir_, lm);
    ASSERT_TRUE(model.ok()) << model.status();
    EngineOptions o;
    o.prefill_chunk = 16;  // the prompt in chunks on every rank
    Engine engine(model->get(), nullptr, &drafts, o);
    GenerationUpdate spec = RunToEnd(engine, r);
    ASSERT_TRUE(spec.status.ok()) << spec.status;
    EXPECT_THAT(spec.token_ids, ElementsAreArray(plain)) << "tp " << tp;
    // The ranks share one page table: a next turn reuses the cached prefix on every rank.
    GenerationRequest turn = r;
    turn.prompt.insert(turn.prompt.end(), spec.token_ids.begin(), spec.token_ids.end());
    turn.prompt.push_back(7);
    const GenerationUpdate hit = RunToEnd(engine, turn);
    ASSERT_TRUE(hit.status.ok()) << hit.status;
    EXPECT_GT(hit.cached_tokens, 0) << "tp " << tp;
    EngineOptions cold_options = o;
    cold_options.prefix_cache = false;
    Engine cold(model->get(), nullptr, &drafts, cold_options);
    const GenerationUpdate want = RunToEnd(cold, turn);
    ASSERT_TRUE(want.status.ok()) << want.status;
    EXPECT_THAT(hit.token_ids, ElementsAreArray(want.token_ids)) << "tp " << tp;
  }
}

// A KV pool that holds one request at a time: the others wait in the queue (no busy loop, no
// failure) and still get exactly their own output.
TEST_F(EngineTest, RequestsWaitForKvPages) {
  LmOptions lm;
  lm.kv_pages = 12;  // one request needs ceil((60 + 48 + 16 + 1) / 16) = 8 pages
  auto model = LoadCpuCausalLm(*target_dir_, lm);
  ASSERT_TRUE(model.ok()) << model.status();
  NgramDrafterFactory factory{NgramOptions()};
  LocalDraftSource drafts(&factory);
  Engine engine(model->get(), nullptr, &drafts, EngineOptions());
  std::vector<GenerationRequest> requests;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = Request(Prompt(30 + i), SpecMode::Of(DrafterKind::kNgram));
    ASSERT_TRUE(engine.Validate(r).ok());
    requests.push_back(r);
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(engine.Submit(r, sinks.back()).ok());
  }
  EXPECT_LE(engine.Snapshot().running, 1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_THAT(sinks[i]->ids(), ElementsAreArray(Plain(requests[i]))) << "request " << i;
  }
  EXPECT_EQ((*model)->kv_cache().free_pages(), 12);
}

// Admission: a request that could never fit the KV cache is refused at validation, and one past
// a full queue at submission, both RESOURCE_EXHAUSTED saying what to change; the engine keeps
// serving the others.
TEST_F(EngineTest, AdmissionLimitsAreResourceExhausted) {
  LmOptions lm;
  lm.kv_pages = 12;  // 300 new tokens need ceil((40 + 300 + 16 + 1) / 16) = 23 pages > 12
  auto model = LoadCpuCausalLm(*target_dir_, lm);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.max_queue = 1;
  Engine engine(model->get(), nullptr, nullptr, options);

  GenerationRequest too_big = Request(Prompt(5), SpecMode::Off(), 300);
  absl::Status big = engine.Validate(too_big);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_THAT(std::string(big.message()), ::testing::HasSubstr("--kv_pages"));

  // 100 new tokens need 10 pages: one runs, the next waits for pages in the queue, a third is
  // refused.
  GenerationRequest running = Request(Prompt(5), SpecMode::Off(), 100);
  ASSERT_TRUE(engine.Validate(running).ok());
  auto running_sink = std::make_shared<RecordingSink>();
  absl::StatusOr<uint64_t> handle = engine.Submit(running, running_sink);
  ASSERT_TRUE(handle.ok());
  for (int i = 0; i < 5000 && engine.Snapshot().running < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(engine.Snapshot().running, 1);
  GenerationRequest waiting = Request(Prompt(6), SpecMode::Off(), 100);
  ASSERT_TRUE(engine.Validate(waiting).ok());
  auto waiting_sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine.Submit(waiting, waiting_sink).ok());
  GenerationRequest refused = Request(Prompt(7), SpecMode::Off(), 100);
  ASSERT_TRUE(engine.Validate(refused).ok());
  absl::StatusOr<uint64_t> full = engine.Submit(refused, std::make_shared<RecordingSink>());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_THAT(std::string(full.status().message()), ::testing::HasSubstr("queue is full"));

  engine.Cancel(*handle);
  ASSERT_TRUE(waiting_sink->Wait());
  EXPECT_THAT(waiting_sink->ids(), ElementsAreArray(Plain(waiting)));
  for (int i = 0; i < 2000 && engine.Snapshot().running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ((*model)->kv_cache().free_pages(), 12);
}

TEST_F(EngineTest, CancelFreesKvPages) {
  const int total = target_->kv_cache().num_pages();
  Engine engine(target_.get(), nullptr, nullptr, EngineOptions());
  GenerationRequest r = Request(Prompt(5, 100), SpecMode::Off(), 300);
  ASSERT_TRUE(engine.Validate(r).ok());
  auto sink = std::make_shared<RecordingSink>();
  absl::StatusOr<uint64_t> handle = engine.Submit(r, sink);
  ASSERT_TRUE(handle.ok());
  while (sink->updates() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_LT(target_->kv_cache().free_pages(), total);
  engine.Cancel(*handle);
  for (int i = 0; i < 2000 && engine.Snapshot().running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(engine.Snapshot().running, 0);
  EXPECT_EQ(target_->kv_cache().free_pages(), total);
  EXPECT_LT(sink->ids().size(), 300u);
  EXPECT_FALSE(sink->final_update().finished);  // a cancelled request gets no more updates
  // The engine keeps serving.
  GenerationUpdate next = RunToEnd(engine, Request(Prompt(6), SpecMode::Off(), 8));
  EXPECT_TRUE(next.status.ok());
  EXPECT_EQ(next.token_ids.size(), 8u);
}

// Drain: new requests are refused with UNAVAILABLE naming the drain, the running one runs to
// its full length, and WaitIdle reports idle only once it has.
TEST_F(EngineTest, DrainFinishesRunningRequestsAndRefusesNewOnes) {
  Engine engine(target_.get(), nullptr, nullptr, EngineOptions());
  EXPECT_TRUE(engine.WaitIdle(absl::ZeroDuration()));
  GenerationRequest r = Request(Prompt(5, 100), SpecMode::Off(), 300);
  ASSERT_TRUE(engine.Validate(r).ok());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine.Submit(r, sink).ok());
  while (sink->updates() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.Drain();
  EXPECT_FALSE(engine.WaitIdle(absl::ZeroDuration())) << "the request is still running";
  GenerationRequest late = Request(Prompt(6), SpecMode::Off(), 8);
  ASSERT_TRUE(engine.Validate(late).ok());
  const absl::StatusOr<uint64_t> refused = engine.Submit(late, std::make_shared<RecordingSink>());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("draining"));
  EXPECT_TRUE(engine.WaitIdle(absl::Seconds(120)));
  ASSERT_TRUE(sink->Wait(10));
  EXPECT_TRUE(sink->final_update().finished);
  EXPECT_EQ(sink->ids().size(), 300u);
}

// A cancel that lands while the engine waits for drafts, on a request that is already ready
// (no speculation), must not leave the scheduler holding a pointer to the freed request
// (under ASan, a dangling one shows as a heap-use-after-free in Engine::Loop). The others are
// unaffected.
TEST_F(EngineTest, CancelWhileWaitingForDrafts) {
  ScriptedDraftSource drafts([](int64_t) { return std::nullopt; });  // never answers
  EngineOptions options;
  options.draft_timeout = absl::Seconds(3);  // the engine sits in the wait when the cancel comes
  options.max_consecutive_timeouts = 1;
  // Two requests waiting for drafts and one ready one: 1 of 3 ready is less than half, so the
  // engine waits for the drafts (or their deadline) before the next step.
  std::vector<GenerationRequest> requests = {
      Request(Prompt(41), SpecMode::Of(DrafterKind::kNgram), 12),
      Request(Prompt(42), SpecMode::Off(), 12),
      Request(Prompt(43), SpecMode::Of(DrafterKind::kNgram), 12)};
  const std::vector<int32_t> plain0 = Plain(requests[0]), plain2 = Plain(requests[2]);
  Engine engine(target_.get(), nullptr, &drafts, options);
  const int total = target_->kv_cache().num_pages();
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<uint64_t> handles;
  for (GenerationRequest& r : requests) {
    ASSERT_TRUE(engine.Validate(r).ok());
    sinks.push_back(std::make_shared<RecordingSink>());
    absl::StatusOr<uint64_t> handle = engine.Submit(r, sinks.back());
    ASSERT_TRUE(handle.ok());
    handles.push_back(*handle);
  }
  for (const auto& sink : sinks) {
    while (sink->updates() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into the draft wait
  engine.Cancel(handles[1]);
  for (int i : {0, 2}) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_TRUE(sinks[i]->final_update().status.ok());
    EXPECT_THAT(sinks[i]->ids(), ElementsAreArray(i == 0 ? plain0 : plain2)) << "request " << i;
  }
  EXPECT_FALSE(sinks[1]->final_update().finished);
  EXPECT_LT(sinks[1]->ids().size(), 12u);
  for (int i = 0; i < 2000 && engine.Snapshot().running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(target_->kv_cache().free_pages(), total);
}

// Garbage trees (bad parents, ids out of range, too many nodes, too deep) are dropped and the
// step runs without a draft; output unchanged.
TEST_F(EngineTest, GarbageDraftsFailOpen) {
  ScriptedDraftSource drafts([](int64_t step) -> std::optional<DraftedTree> {
    DraftedTree t;
    switch (step % 4) {
      case 0:
        t.tokens = {5, 6};
        t.parents = {1, -1};
        break;  // parent after child
      case 1:
        t.tokens = {100000};
        t.parents = {-1};
        break;  // id out of range
      case 2:
        t.tokens.assign(500, 7);
        t.parents.assign(500, -1);
        break;  // over budget
      case 3:
        t.tokens = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4};  // deeper than max_depth
        t.parents = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8};
        break;
    }
    return t;
  });
  GenerationRequest r = Request(Prompt(4), SpecMode::Of(DrafterKind::kNgram));
  r.spec.max_depth = 8;
  const std::vector<int32_t> plain = Plain(r);
  Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
  GenerationUpdate spec = RunToEnd(engine, r);
  ASSERT_TRUE(spec.status.ok());
  EXPECT_THAT(spec.token_ids, ElementsAreArray(plain));
  EXPECT_EQ(spec.stats.accepted_tokens, 0);
  EXPECT_EQ(spec.stats.fallback_steps, spec.stats.steps);
  EXPECT_EQ(spec.stats.bad_trees, spec.stats.steps);  // each one counted
}

// A drafter that never answers costs at most the deadline per step, then is not waited for.
TEST_F(EngineTest, SilentDrafterTimesOut) {
  ScriptedDraftSource drafts([](int64_t) { return std::nullopt; });
  EngineOptions options;
  options.draft_timeout = absl::Milliseconds(20);
  options.max_consecutive_timeouts = 2;
  GenerationRequest r = Request(Prompt(8), SpecMode::Of(DrafterKind::kNgram), 40);
  const absl::Time plain_start = absl::Now();
  const std::vector<int32_t> plain = Plain(r);
  const double plain_ms = absl::ToDoubleMilliseconds(absl::Now() - plain_start);
  Engine engine(target_.get(), nullptr, &drafts, options);
  const absl::Time start = absl::Now();
  GenerationUpdate spec = RunToEnd(engine, r);
  ASSERT_TRUE(spec.status.ok());
  EXPECT_THAT(spec.token_ids, ElementsAreArray(plain));
  // Two waits of 20 ms, then none: far below 40 steps x 20 ms on top of the plain run's own
  // time (measured here, so a slow or loaded machine, a sanitizer build, does not fail it).
  EXPECT_LT(absl::ToDoubleMilliseconds(absl::Now() - start), 1.25 * plain_ms + 400.0);
}

// A drafter that is slow for the first steps (trees arrive after the deadline, so the session
// counts as slow and steps stop waiting) and then fast again gets speculation back through the
// periodic re-probe; the output never changes.
TEST_F(EngineTest, SlowDrafterRecovers) {
  NgramDrafterFactory factory{NgramOptions()};
  DelayedDraftSource drafts(&factory, [](int64_t step) {
    return step < 6 ? absl::Milliseconds(60) : absl::Microseconds(200);
  });
  EngineOptions options;
  options.draft_timeout = absl::Milliseconds(20);
  options.max_consecutive_timeouts = 3;
  GenerationRequest r = Request(Prompt(12), SpecMode::Of(DrafterKind::kNgram), 150);
  const std::vector<int32_t> plain = Plain(r);
  Engine engine(target_.get(), nullptr, &drafts, options);
  GenerationUpdate spec = RunToEnd(engine, r);
  ASSERT_TRUE(spec.status.ok()) << spec.status;
  EXPECT_THAT(spec.token_ids, ElementsAreArray(plain));
  // Without the re-probe every later tree answers a step already verified: nothing accepted.
  EXPECT_GT(spec.stats.accepted_tokens, 0);
  EXPECT_LT(spec.stats.fallback_steps, spec.stats.steps);
}

TEST_F(EngineTest, ValidationNamesTheField) {
  Engine engine(target_.get(), nullptr, nullptr, EngineOptions());
  auto check = [&](GenerationRequest r, absl::StatusCode code, const std::string& needle) {
    absl::Status s = engine.Validate(r);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(needle));
  };
  GenerationRequest ok = Request({5, 6, 7}, SpecMode::Off(), 10);
  check(Request({}, SpecMode::Off()), absl::StatusCode::kInvalidArgument, "prompt is empty");
  check(Request({5, 512}, SpecMode::Off()), absl::StatusCode::kInvalidArgument,
        "512 at index 1 is out of range [0, 512)");
  check(Request(std::vector<int32_t>(512, 5), SpecMode::Off()), absl::StatusCode::kInvalidArgument,
        "context length is 512");
  GenerationRequest r = ok;
  r.max_new_tokens = 0;
  check(r, absl::StatusCode::kInvalidArgument, "max_new_tokens must be > 0");
  r.max_new_tokens = 600;
  check(r, absl::StatusCode::kInvalidArgument, "set max_new_tokens <= 509");
  // prompt + max_new_tokens must not overflow into a small (or negative) sum that passes.
  r.max_new_tokens = std::numeric_limits<int32_t>::max();
  check(r, absl::StatusCode::kInvalidArgument, "set max_new_tokens <= 509");
  r = ok;
  r.sampling.temperature = -1;
  check(r, absl::StatusCode::kInvalidArgument, "temperature");
  r = ok;
  r.top_p = 0.0f;
  check(r, absl::StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  r.top_p = 1.5f;
  check(r, absl::StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  r = ok;
  // Without drafters the verifier's own maxima (the protocol's) bound the limits; 0 is unset.
  r.spec.tree_budget = -1;
  check(r, absl::StatusCode::kInvalidArgument, "speculation.tree_budget must be in [1, 1024]");
  r.spec.tree_budget = 100000;
  check(r, absl::StatusCode::kInvalidArgument, "speculation.tree_budget must be in [1, 1024]");
  r.spec.tree_budget = 0;
  r.spec.max_depth = 65;
  check(r, absl::StatusCode::kInvalidArgument, "speculation.max_depth must be in [1, 64]");
  r.spec.max_depth = 0;
  ASSERT_TRUE(engine.Validate(r).ok());
  EXPECT_EQ(r.spec, (SpecLimits{16, 8, 0}));
  r = ok;
  r.spec_mode = SpecMode::Of(DrafterKind::kNgram);
  check(r, absl::StatusCode::kFailedPrecondition, "--drafter");
  r.spec_mode = SpecMode::Auto();
  EXPECT_TRUE(engine.Validate(r).ok());
  EXPECT_EQ(r.spec_mode, SpecMode::Off());
  r = ok;
  r.stop_token_ids.assign(kMaxStopTokenIds + 1, 5);
  check(r, absl::StatusCode::kInvalidArgument, "at most 64 stop_token_ids");
  r = ok;
  r.stop_strings.assign(kMaxStopStrings + 1, "x");
  check(r, absl::StatusCode::kInvalidArgument, "16 stop_strings");
}

// The verifier takes its maxima from what its drafters state: a request above them is refused
// naming the drafters' flag (never run without speculation), a default above them is lowered
// to them, and a kind no drafter serves is refused.
TEST_F(EngineTest, SpeculationLimitsFollowWhatTheDraftersServe) {
  NgramDrafterFactory factory{NgramOptions()};
  StatedPoolSource drafts(&factory,
                          DrafterPoolInfo{1, SpecLimits{8, 64, 8}, {DrafterKind::kNgram}});
  Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
  EXPECT_EQ(engine.spec_bounds().max.tree_budget, 8);

  GenerationRequest r = Request(Prompt(3), SpecMode::Auto(), 24);
  r.spec.tree_budget = 9;
  absl::Status refused = engine.Validate(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("speculation.tree_budget must be in [1, 8] (got 9); 8 is the "
                                   "largest --max_tree_budget of the 1 drafter(s)"));
  r.spec_mode = SpecMode::Of(DrafterKind::kDraftModel);
  r.spec.tree_budget = 4;
  refused = engine.Validate(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            "speculation.mode DRAFT_MODEL: none of the 1 drafter(s) this verifier has heard from "
            "serves it (they serve NGRAM); use AUTO or one of those, or start drafters with "
            "--draft_model=DIR");
  r.spec_mode = SpecMode::Of(DrafterKind::kDflash);
  refused = engine.Validate(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("speculation.mode DFLASH: none of the 1 drafter(s)"));

  GenerationRequest unset = Request(Prompt(3), SpecMode::Of(DrafterKind::kNgram), 24);
  const std::vector<int32_t> plain = Plain(unset);
  GenerationUpdate out = RunToEnd(engine, unset);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(out.token_ids, ElementsAreArray(plain));
  ASSERT_EQ(drafts.opened().size(), 1u);
  EXPECT_EQ(drafts.opened()[0].limits, (SpecLimits{8, 8, 0}));  // the default 16 lowered to 8
  EXPECT_GT(out.stats.drafted_tokens, 0);
}

// A kind that reads the target's features (DFlash) is refused at admission when no drafter of
// the pool that serves it was trained for this verifier's target, naming both shapes; one
// drafter that fits is enough.
TEST_F(EngineTest, AFeatureDrafterForAnotherTargetIsRefused) {
  NgramDrafterFactory factory{NgramOptions()};
  const ModelConfig& c = target_->config();
  const FeatureSpec fits{{0, 1}, c.hidden_size, c.num_layers, c.vocab_size};
  FeatureSpec other = fits;
  other.hidden = 4096;
  other.num_layers = 36;
  DrafterPoolInfo pool{1, SpecLimits{16, 8, 16}, {DrafterKind::kDflash}};
  pool.feature_needs = {{DrafterKind::kDflash, other}};
  StatedPoolSource drafts(&factory, pool);
  Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
  GenerationRequest r = Request(Prompt(3), SpecMode::Of(DrafterKind::kDflash), 8);
  const absl::Status refused = engine.Validate(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            absl::StrCat("speculation.mode DFLASH: its drafter was trained for a target of hidden "
                         "4096, 36 layers, vocab ",
                         c.vocab_size, "; this verifier serves hidden ", c.hidden_size, ", ",
                         c.num_layers, " layers, vocab ", c.vocab_size,
                         ": pair it with the target it was trained for, or use another drafter "
                         "kind"));

  pool.feature_needs.push_back({DrafterKind::kDflash, fits});
  StatedPoolSource mixed(&factory, pool);
  Engine engine2(target_.get(), nullptr, &mixed, EngineOptions());
  r = Request(Prompt(3), SpecMode::Of(DrafterKind::kDflash), 8);
  EXPECT_TRUE(engine2.Validate(r).ok());
  FeatureSpec bad_layers = fits;
  bad_layers.layers = {0, c.num_layers};
  EXPECT_THAT(
      std::string(CheckFeatureTarget(bad_layers, c.hidden_size, c.num_layers, c.vocab_size, "it")
                      .message()),
      ::testing::HasSubstr("not strictly ascending within the target's"));
}

// A session of a kind that reads target features is opened with the layers its pool's drafters
// read (AUTO resolving to that kind when it is the pool's default) and sent, commit by commit,
// the features of every context token but the pending bonus: the prompt's rows after prefill,
// then the rows of each step's accepted path. Together they equal a plain forward's captured
// layers of the whole context, and the output equals speculation off. A kind that reads tokens
// only is sent none.
TEST_F(EngineTest, AFeatureDrafterIsSentTheFeaturesOfEveryContextToken) {
  const ModelConfig& c = target_->config();
  const auto self = SelfDrafter(DraftShape::kChain);
  ASSERT_NE(self, nullptr);
  const FeatureSpec reads_0{{0}, c.hidden_size, c.num_layers, c.vocab_size};
  FeatureSpec reads_1 = reads_0;
  reads_1.layers = {1};
  RecordingFactory recording(self.get(), reads_1);
  DrafterPoolInfo pool{1, SpecLimits{16, 8, 16}, {DrafterKind::kDraftModel, DrafterKind::kDflash}};
  pool.default_kind = DrafterKind::kDflash;
  // Drafters of the kind that read other layers, or serve another target, add theirs / none.
  FeatureSpec other_target = reads_0;
  other_target.hidden *= 2;
  pool.feature_needs = {{DrafterKind::kDflash, reads_0},
                        {DrafterKind::kDflash, reads_1},
                        {DrafterKind::kDflash, other_target}};
  StatedPoolSource drafts(&recording, pool);
  EngineOptions chunked;
  chunked.prefill_chunk = 7;  // the prompt's features come from 9 chunks
  Engine engine(target_.get(), nullptr, &drafts, EngineOptions());
  Engine chunked_engine(target_.get(), nullptr, &drafts, chunked);

  for (auto [temperature, serving] :
       {std::pair{0.0f, &engine}, {0.8f, &engine}, {0.0f, &chunked_engine}}) {
    GenerationRequest r = Request(Prompt(5), SpecMode::Auto(), 40);
    r.sampling.temperature = temperature;
    r.sampling.seed = 11;
    r.spec.tree_budget = 6;
    r.spec.max_depth = 6;
    const std::vector<int32_t> plain = Plain(r);
    GenerationUpdate out = RunToEnd(*serving, r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_THAT(out.token_ids, ElementsAreArray(plain)) << "temperature " << temperature;
    if (temperature == 0.0f) EXPECT_GT(out.stats.MeanAcceptanceLength(), 2.0);
    ASSERT_FALSE(drafts.opened().empty());
    const DraftOpenParams& opened = drafts.opened().back();
    EXPECT_EQ(opened.mode, SpecMode::Of(DrafterKind::kDflash));
    EXPECT_THAT(opened.feature_layers, ElementsAreArray({0, 1}));
    EXPECT_THAT(target_->feature_layers(), ElementsAreArray({0, 1}));

    // The context the session was given: the prompt, then every commit's tokens; a row for
    // each token but the last.
    ASSERT_GT(recording.log().tokens.size(), r.prompt.size() + 8);
    std::vector<int32_t> context = r.prompt;
    context.insert(context.end(), out.token_ids.begin(), out.token_ids.end());
    ExpectTheFeaturesOfAPrefill(recording.log(), context, {0, 1});
  }

  // A kind that reads tokens only is sent none.
  GenerationRequest tokens_only = Request(Prompt(6), SpecMode::Of(DrafterKind::kDraftModel), 8);
  ASSERT_TRUE(RunToEnd(engine, tokens_only).status.ok());
  EXPECT_EQ(drafts.opened().back().mode, SpecMode::Of(DrafterKind::kDraftModel));
  EXPECT_TRUE(drafts.opened().back().feature_layers.empty());
}

// --max_new_tokens_limit caps what a request may ask for below the context: one token more is
// INVALID_ARGUMENT naming the field and the flag, the limit itself passes, and a request that
// sets none gets the default (which the options keep within the limit).
TEST_F(EngineTest, MaxNewTokensLimitIsInvalidArgumentNamingTheFlag) {
  EngineOptions options;
  options.max_new_tokens_limit = 100;
  options.default_max_new_tokens = 40;
  ASSERT_TRUE(ValidateEngineOptions(options).ok());
  Engine engine(target_.get(), nullptr, nullptr, options);
  EXPECT_EQ(engine.max_new_tokens_limit(), 100);

  GenerationRequest over = Request(Prompt(5), SpecMode::Off(), 101);
  const absl::Status refused = engine.Validate(over);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            "sampling.max_new_tokens is 101 but this server allows at most 100 "
            "(--max_new_tokens_limit)");
  GenerationRequest at_limit = Request(Prompt(5), SpecMode::Off(), 100);
  EXPECT_TRUE(engine.Validate(at_limit).ok());
  GenerationRequest unset = Request(Prompt(5), SpecMode::Off());
  unset.max_new_tokens.reset();
  ASSERT_TRUE(engine.Validate(unset).ok());
  EXPECT_EQ(unset.max_new_tokens, 40);

  // The context (512 here) stays the bound without a limit, and above a larger one.
  for (const int limit : {0, 5000}) {
    options.max_new_tokens_limit = limit;
    Engine unlimited(target_.get(), nullptr, nullptr, options);
    EXPECT_EQ(unlimited.max_new_tokens_limit(), 511) << limit;
    GenerationRequest r = Request(Prompt(5), SpecMode::Off(), 101);
    EXPECT_TRUE(unlimited.Validate(r).ok()) << limit;
  }
}

TEST(EngineOptionsTest, FlagsOutOfRangeNameTheFlag) {
  EXPECT_TRUE(ValidateEngineOptions(EngineOptions()).ok());
  EngineOptions o;
  o.max_batch = 0;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()), ::testing::HasSubstr("--max_batch"));
  o = EngineOptions();
  o.spec.defaults.tree_budget = 2000;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()),
              ::testing::HasSubstr("--tree_budget"));
  o = EngineOptions();
  o.spec.defaults.max_depth = 0;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()), ::testing::HasSubstr("--max_depth"));
  o = EngineOptions();
  o.max_queue = 0;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()), ::testing::HasSubstr("--max_queue"));
  o = EngineOptions();
  o.max_new_tokens_limit = -1;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()),
              ::testing::HasSubstr("--max_new_tokens_limit"));
  o = EngineOptions();
  o.max_new_tokens_limit = 100;  // below the default --max_new_tokens (256)
  EXPECT_THAT(
      std::string(ValidateEngineOptions(o).message()),
      ::testing::HasSubstr("--max_new_tokens (256) must be <= --max_new_tokens_limit (100)"));
  o = EngineOptions();
  o.prefill_chunk = -1;
  EXPECT_THAT(std::string(ValidateEngineOptions(o).message()),
              ::testing::HasSubstr("--prefill_chunk"));
  o = EngineOptions();
  o.draft_timeout = absl::Milliseconds(-1);
  EXPECT_FALSE(ValidateEngineOptions(o).ok());
}

}  // namespace
}  // namespace treespec
