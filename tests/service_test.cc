// The services over real gRPC on loopback (in-process servers on port 0) with the shipped tiny
// model pair: concurrent streaming clients, the bad-input catalogue, client cancel, a drafter
// that goes away mid-run, model info and health.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <memory>
#include <thread>

#include "common/model/causal_lm.h"
#include "common/tokenizer/tokenizer.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/local_verifier.h"
#include "treespec/v1/generation.grpc.pb.h"
#include "verifier_service/drafter_client.h"
#include "verifier_service/engine.h"
#include "verifier_service/engine_test_util.h"
#include "verifier_service/generation_service.h"
#include "verifier_service/serving_metrics.h"

namespace treespec {
namespace {

using testing::CodePrompts;
using testing::Generate;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::TextRequest;

const std::string kRoot = TREESPEC_SOURCE_DIR;

struct Drafter {
  std::unique_ptr<DrafterService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

Drafter StartDrafter() {
  Drafter d;
  LmOptions lm;
  lm.max_batch = 16;
  auto model = LoadCpuCausalLm(kRoot + "/models/tiny-draft", lm);
  EXPECT_TRUE(model.ok()) << model.status();
  DrafterServiceOptions options;
  options.default_kind = DrafterKind::kDraftModel;
  options.vocab_size = (*model)->config().vocab_size;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions()));
  drafters.Add(DrafterKind::kDraftModel,
               std::make_unique<DraftModelDrafterFactory>(*std::move(model), DraftModelOptions()));
  d.service = std::make_unique<DrafterService>(options, std::move(drafters));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &d.port);
  builder.RegisterService(d.service.get());
  d.server = builder.BuildAndStart();
  return d;
}

class ServiceTest : public ::testing::Test {
 protected:
  static constexpr int kMaxQueue = 100;
  static constexpr int kMaxDepthLimit = 32;
  static constexpr int kMaxNewTokensLimit = 1900;

  void SetUp() override {
    drafter_ = StartDrafter();
    ASSERT_NE(drafter_.port, 0);
    absl::StatusOr<testing::TinyTarget> target = testing::LoadTinyTarget(8);
    ASSERT_TRUE(target.ok()) << target.status();
    model_ = std::move(target->model);
    tokenizer_ = std::move(target->tokenizer);
    testing::LocalVerifierOptions options;
    options.drafter = "127.0.0.1:" + std::to_string(drafter_.port);
    options.engine.max_batch = 8;
    options.engine.draft_timeout = absl::Milliseconds(200);  // generous: CI machines are slow
    // Limits off their defaults, so ModelInfoAndHealth sees them reported as configured.
    options.engine.max_queue = kMaxQueue;
    options.engine.spec.max.max_depth = kMaxDepthLimit;
    options.engine.max_new_tokens_limit = kMaxNewTokensLimit;
    options.info.model_name = "tiny-target";
    options.info.device = "cpu";
    verifier_ = std::make_unique<testing::LocalVerifier>(model_.get(), tokenizer_.get(), options);
    ASSERT_TRUE(verifier_->ok());
    engine_ = verifier_->engine();
    drafts_ = verifier_->drafts();
    stub_ = verifier_->stub();
    // The verifier's limits follow its drafter's statement (Drafter.GetInfo, asked at start).
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (drafts_->PoolInfo().drafters == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(drafts_->PoolInfo().drafters, 1);
  }

  void TearDown() override {
    verifier_.reset();
    if (drafter_.server) drafter_.server->Shutdown(std::chrono::system_clock::now());
  }

  Drafter drafter_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<testing::LocalVerifier> verifier_;
  Engine* engine_ = nullptr;           // verifier_'s
  GrpcDraftSource* drafts_ = nullptr;  // verifier_'s
  v1::Generation::Stub* stub_ = nullptr;
};

// The first four code prompts.
const std::vector<std::string> kPrompts(CodePrompts().begin(), CodePrompts().begin() + 4);

TEST_F(ServiceTest, ConcurrentStreamsMatchPlainDecoding) {
  std::vector<Outcome> plain;
  for (const std::string& p : kPrompts) {
    plain.push_back(Generate(stub_, TextRequest(p, v1::SPECULATION_MODE_OFF, 40)));
    ASSERT_TRUE(plain.back().status.ok()) << plain.back().status.error_message();
    ASSERT_EQ(plain.back().ids.size(), 40u);
  }
  const v1::SpeculationMode modes[] = {v1::SPECULATION_MODE_AUTO, v1::SPECULATION_MODE_NGRAM,
                                       v1::SPECULATION_MODE_DRAFT_MODEL};
  std::vector<Outcome> spec(kPrompts.size() * std::size(modes));
  std::vector<std::thread> clients;
  for (size_t m = 0; m < std::size(modes); ++m) {
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      clients.emplace_back([&, m, i] {
        spec[m * kPrompts.size() + i] = Generate(stub_, TextRequest(kPrompts[i], modes[m], 40));
      });
    }
  }
  for (auto& t : clients) t.join();
  double accepted = 0, drafted_steps = 0;
  for (size_t m = 0; m < std::size(modes); ++m) {
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const Outcome& o = spec[m * kPrompts.size() + i];
      ASSERT_TRUE(o.status.ok()) << o.status.error_message();
      EXPECT_EQ(o.ids, plain[i].ids) << "mode " << modes[m] << " prompt " << i;
      EXPECT_EQ(o.text, plain[i].text);
      EXPECT_EQ(o.last.usage().completion_tokens(), 40);
      // The plain runs left every prompt's full pages in the prefix cache.
      const int page = verifier_->Info().kv_page_size();
      EXPECT_EQ(o.last.usage().cached_tokens(), (o.last.usage().prompt_tokens() - 1) / page * page)
          << "mode " << modes[m] << " prompt " << i;
      if (modes[m] == v1::SPECULATION_MODE_DRAFT_MODEL) {
        accepted += o.last.speculation().accepted_tokens();
        drafted_steps += o.last.speculation().steps() - o.last.speculation().fallback_steps();
      }
    }
  }
  // The trained draft really drafts: well over one token per drafted step on code. Per drafted
  // step, not per step: on a loaded machine drafts miss the 200 ms wait, and a step verified
  // without one says nothing about the draft's quality.
  ASSERT_GT(drafted_steps, 0) << "no step had a draft";
  EXPECT_GT(1 + accepted / drafted_steps, 1.5);
}

TEST_F(ServiceTest, BadInputGetsActionableStatusAndServerKeepsServing) {
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest&)> edit;
    grpc::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"empty prompt", [](auto& r) { r.set_text(""); }, grpc::INVALID_ARGUMENT, "prompt is empty"},
      {"no prompt", [](auto& r) { r.clear_prompt(); }, grpc::INVALID_ARGUMENT, "prompt is empty"},
      {"id out of range",
       [](auto& r) {
         r.mutable_token_ids()->add_ids(5);
         r.mutable_token_ids()->add_ids(91234);
       },
       grpc::INVALID_ARGUMENT, "91234 at index 1 is out of range [0, 4096)"},
      {"invalid utf-8", [](auto& r) { r.set_text(std::string("ab\xff\xfe", 4)); },
       grpc::INVALID_ARGUMENT, "UTF-8"},
      {"prompt too long",
       [](auto& r) {
         for (int i = 0; i < 2048; ++i) r.mutable_token_ids()->add_ids(7);
       },
       grpc::INVALID_ARGUMENT, "context length is 2048"},
      {"max_new_tokens 0", [](auto& r) { r.mutable_sampling()->set_max_new_tokens(0); },
       grpc::INVALID_ARGUMENT, "max_new_tokens must be > 0"},
      {"max_new_tokens negative", [](auto& r) { r.mutable_sampling()->set_max_new_tokens(-5); },
       grpc::INVALID_ARGUMENT, "max_new_tokens must be > 0"},
      {"max_new_tokens beyond context",
       [](auto& r) { r.mutable_sampling()->set_max_new_tokens(5000); }, grpc::INVALID_ARGUMENT,
       "exceeds the context length 2048"},
      {"max_new_tokens INT32_MAX",
       [](auto& r) { r.mutable_sampling()->set_max_new_tokens(2147483647); },
       grpc::INVALID_ARGUMENT, "exceeds the context length 2048"},
      {"max_new_tokens over the limit",
       [](auto& r) { r.mutable_sampling()->set_max_new_tokens(kMaxNewTokensLimit + 1); },
       grpc::INVALID_ARGUMENT, "allows at most 1900 (--max_new_tokens_limit)"},
      {"max_depth over the limit", [](auto& r) { r.mutable_speculation()->set_max_depth(33); },
       grpc::INVALID_ARGUMENT, "max_depth must be in [1, 32]"},
      {"temperature < 0", [](auto& r) { r.mutable_sampling()->set_temperature(-0.5f); },
       grpc::INVALID_ARGUMENT, "temperature must be a finite number >= 0"},
      {"top_p 0", [](auto& r) { r.mutable_sampling()->set_top_p(0.0f); }, grpc::INVALID_ARGUMENT,
       "top_p must be in (0, 1]"},
      {"top_p > 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, grpc::INVALID_ARGUMENT,
       "top_p must be in (0, 1]"},
      {"unknown mode",
       [](auto& r) { r.mutable_speculation()->set_mode(static_cast<v1::SpeculationMode>(42)); },
       grpc::INVALID_ARGUMENT, "speculation.mode 42 is not a known mode"},
      {"request_id not UTF-8", [](auto& r) { r.set_request_id("id-\xc3\x28"); },
       grpc::INVALID_ARGUMENT, "request_id is not valid UTF-8 (byte 3 of 5)"},
      {"stop string not UTF-8",
       [](auto& r) {
         r.mutable_sampling()->add_stop_strings("fine");
         r.mutable_sampling()->add_stop_strings("\xed\xa0\x80");  // a surrogate's encoding
       },
       grpc::INVALID_ARGUMENT, "sampling.stop_strings[1] is not valid UTF-8 (byte 0 of 3)"},
      {"tree budget -1", [](auto& r) { r.mutable_speculation()->set_tree_budget(-1); },
       grpc::INVALID_ARGUMENT, "tree_budget must be in [1, 512]"},
      {"tree budget huge", [](auto& r) { r.mutable_speculation()->set_tree_budget(1 << 30); },
       grpc::INVALID_ARGUMENT,
       "tree_budget must be in [1, 512] (got 1073741824); 512 is the largest --max_tree_budget "
       "of the 1 drafter(s)"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = TextRequest("def f(x):\n    return", v1::SPECULATION_MODE_AUTO, 8);
    c.edit(r);
    Outcome o = Generate(stub_, r);
    EXPECT_EQ(o.status.error_code(), c.code) << c.name << ": " << o.status.error_message();
    EXPECT_THAT(o.status.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(o.ids.empty()) << c.name;
  }
  Outcome good =
      Generate(stub_, TextRequest("def f(x):\n    return", v1::SPECULATION_MODE_AUTO, 8));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.ids.size(), 8u);
}

TEST_F(ServiceTest, ClientCancelFreesKvPages) {
  const v1::ModelInfo before = verifier_->Info();
  ASSERT_EQ(before.kv_pages_free(), before.kv_cache_pages());
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, TextRequest(kPrompts[0], v1::SPECULATION_MODE_AUTO, 1500));
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_LT(verifier_->Info().kv_pages_free(), before.kv_cache_pages());
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
  EXPECT_TRUE(verifier_->WaitForAllPagesFree(absl::Seconds(5)));
}

TEST_F(ServiceTest, DrafterGoingAwayChangesNoOutput) {
  const v1::GenerateRequest request = TextRequest(kPrompts[1], v1::SPECULATION_MODE_AUTO, 120);
  const Outcome plain = Generate(stub_, TextRequest(kPrompts[1], v1::SPECULATION_MODE_OFF, 120));
  ASSERT_TRUE(plain.status.ok());
  Outcome spec;
  std::thread client([&] { spec = Generate(stub_, request); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  drafter_.server->Shutdown(std::chrono::system_clock::now());  // cancels live sessions
  client.join();
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain.ids);
  // New requests still work with no drafter at all.
  Outcome after = Generate(stub_, request);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.ids, plain.ids);
}

// Discovery: with two drafter replicas behind one target, sessions go to both (round robin);
// once one reports NOT_SERVING on grpc.health.v1, new sessions avoid it (client-side health
// checking). Outputs are plain decoding's either way.
TEST(DiscoveryTest, SessionsSpreadOverHealthyDrafterReplicas) {
  grpc::EnableDefaultHealthCheckService(true);  // the drafters serve grpc.health.v1
  Drafter a = StartDrafter(), b = StartDrafter();
  ASSERT_NE(a.port, 0);
  ASSERT_NE(b.port, 0);
  LmOptions lm;
  lm.max_batch = 4;
  auto model = LoadCpuCausalLm(kRoot + "/models/tiny-target", lm);
  ASSERT_TRUE(model.ok()) << model.status();
  GrpcDraftSource drafts(absl::StrCat("ipv4:127.0.0.1:", a.port, ",127.0.0.1:", b.port));
  EngineOptions options;
  options.max_batch = 4;
  options.draft_timeout = absl::Milliseconds(200);
  Engine engine(model->get(), nullptr, &drafts, options);
  auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      GenerationRequest r;
      r.id = absl::StrCat("r", i);
      r.prompt = {5, 6, 7, static_cast<int32_t>(8 + i)};
      r.max_new_tokens = 8;
      r.ignore_eos = true;
      r.spec_mode = SpecMode::Of(DrafterKind::kDraftModel);
      ASSERT_TRUE(engine.Validate(r).ok());
      auto sink = std::make_shared<testing::RecordingSink>();
      ASSERT_TRUE(engine.Submit(r, sink).ok());
      ASSERT_TRUE(sink->Wait());
      EXPECT_TRUE(sink->final_update().status.ok());
    }
  };
  run(8);
  EXPECT_GT(a.service->total_sessions(), 0);
  EXPECT_GT(b.service->total_sessions(), 0);

  b.server->GetHealthCheckService()->SetServingStatus(false);
  // The client sees the change through its health watch; give it a moment, then count.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t b_before = b.service->total_sessions();
  run(6);
  EXPECT_EQ(b.service->total_sessions(), b_before) << "a NOT_SERVING drafter got new sessions";
  engine.Shutdown();
  a.server->Shutdown(std::chrono::system_clock::now());
  b.server->Shutdown(std::chrono::system_clock::now());
}

// A server for `service` alone on a free loopback port, and a stub to it (null on failure).
struct LocalServer {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Generation::Stub> stub;
};
LocalServer Serve(GenerationService& service) {
  LocalServer local;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  local.server = builder.BuildAndStart();
  if (local.server == nullptr || port == 0) return local;
  local.stub = v1::Generation::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  return local;
}

// The value of `series` (a metric name with its labels, as exposed) in a text scrape; -1 if
// absent.
double Scraped(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  for (size_t at = 0; (at = text.find(key, at)) != std::string::npos; at += key.size()) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  }
  return -1;
}

// /metrics counts what the clients saw: requests by reason, tokens, latency observations, and
// the speculation counters equal the sums of the requests' own statistics.
TEST_F(ServiceTest, MetricsCountWhatClientsSaw) {
  ServingMetrics metrics([this] { return engine_->Snapshot(); });
  drafts_->SetMetrics(&metrics);
  ServiceInfo info;
  info.model_name = "tiny-target";
  GenerationService service(engine_, model_.get(), tokenizer_.get(), info, &metrics);
  LocalServer local = Serve(service);
  ASSERT_NE(local.stub, nullptr);
  v1::Generation::Stub* stub = local.stub.get();
  int64_t tokens = 0, steps = 0, fallback = 0, drafted = 0, accepted = 0, depth1 = 0;
  int64_t prompt = 0, cached = 0;
  for (const auto& [mode, max_new] :
       {std::pair{v1::SPECULATION_MODE_AUTO, 24}, std::pair{v1::SPECULATION_MODE_AUTO, 24},
        std::pair{v1::SPECULATION_MODE_OFF, 16}}) {
    const Outcome o = Generate(stub, TextRequest(kPrompts[1], mode, max_new));
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    tokens += static_cast<int64_t>(o.ids.size());
    prompt += o.last.usage().prompt_tokens();
    cached += o.last.usage().cached_tokens();
    const v1::SpeculationStats& s = o.last.speculation();
    steps += s.steps();
    fallback += s.fallback_steps();
    drafted += s.drafted_tokens();
    accepted += s.accepted_tokens();
    if (s.accepted_per_depth_size() > 0) depth1 += s.accepted_per_depth(0);
  }
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(10)));
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Scraped(text, "treespec_requests_total{reason=\"length\"}"), 3) << text;
  EXPECT_EQ(Scraped(text, "treespec_generation_tokens_total"), tokens);
  // The same prompt three times: the second and third reuse the first's cached pages (the
  // tiny pair's drafters take no target features, so every request looks the cache up).
  EXPECT_GT(cached, 0);
  EXPECT_EQ(Scraped(text, "treespec_prefix_cache_queried_tokens_total"), prompt);
  EXPECT_EQ(Scraped(text, "treespec_prefix_cache_hit_tokens_total"), cached);
  EXPECT_GT(Scraped(text, "treespec_prefix_cache_pages"), 0);
  EXPECT_EQ(Scraped(text, "treespec_prefix_cache_evicted_pages_total"), 0);
  EXPECT_EQ(Scraped(text, "treespec_time_to_first_token_seconds_count"), 3);
  EXPECT_GT(Scraped(text, "treespec_inter_token_latency_seconds_count"), 0);
  EXPECT_EQ(Scraped(text, "treespec_spec_verify_steps_total"), steps);
  EXPECT_EQ(Scraped(text, "treespec_spec_fallback_steps_total"), fallback);
  EXPECT_EQ(Scraped(text, "treespec_spec_drafts_total"), steps - fallback);
  EXPECT_EQ(Scraped(text, "treespec_spec_draft_tokens_total"), drafted);
  EXPECT_EQ(Scraped(text, "treespec_spec_accepted_tokens_total"), accepted);
  EXPECT_GT(accepted, 0) << "the drafts were never accepted: the counters were not exercised";
  EXPECT_EQ(Scraped(text, "treespec_spec_accepted_tokens_by_depth_total{depth=\"1\"}"), depth1);
  EXPECT_GT(Scraped(text, "treespec_verify_step_seconds_total{part=\"forward\"}"), 0);
  EXPECT_EQ(Scraped(text, "treespec_requests_running"), 0);
  EXPECT_EQ(Scraped(text, "treespec_kv_cache_utilization"), 0);
  EXPECT_EQ(Scraped(text, "treespec_kv_cache_pages"), engine_->Snapshot().kv_pages_total);
  // The trees answering commits were timed: every drafted step's but perhaps the first of each
  // of the two speculative requests (answering the session's open, not a commit).
  EXPECT_GE(Scraped(text, "treespec_drafter_round_trip_seconds_count"), steps - fallback - 2);
  EXPECT_GT(Scraped(text, "treespec_drafter_round_trip_seconds_count"), 0);
  local.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  drafts_->SetMetrics(nullptr);  // `metrics` goes out of scope before the fixture's engine
}

// A service not yet activated (the verifier listens while its model loads) answers UNAVAILABLE
// saying so, to Generate and GetModelInfo; once activated it serves.
TEST_F(ServiceTest, LoadingServiceIsUnavailableUntilActivated) {
  GenerationService loading;
  LocalServer local = Serve(loading);
  ASSERT_NE(local.stub, nullptr);
  v1::Generation::Stub* stub = local.stub.get();
  const v1::GenerateRequest request = TextRequest(kPrompts[0], v1::SPECULATION_MODE_OFF, 8);
  const Outcome early = Generate(stub, request);
  EXPECT_EQ(early.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(early.status.error_message(), HasSubstr("still loading"));
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  ServiceInfo info;
  info.model_name = "tiny-target";
  loading.Activate(engine_, model_.get(), tokenizer_.get(), info);
  const Outcome served = Generate(stub, request);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.ids.size(), 8u);
  local.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

TEST_F(ServiceTest, ModelInfoAndHealth) {
  const v1::ModelInfo info = verifier_->Info();
  EXPECT_EQ(info.vocab_size(), 4096);
  EXPECT_EQ(info.context_length(), 2048);
  EXPECT_EQ(info.architecture(), "LlamaForCausalLM");
  EXPECT_EQ(info.num_layers(), 6);
  EXPECT_THAT(info.eos_token_ids(), ::testing::ElementsAre(0));
  EXPECT_EQ(info.max_prompt_tokens(), 2047);
  EXPECT_EQ(info.max_queue(), kMaxQueue);
  EXPECT_EQ(info.max_depth_limit(), kMaxDepthLimit);
  EXPECT_EQ(info.max_new_tokens_limit(), kMaxNewTokensLimit);
  EXPECT_EQ(info.max_tree_budget(), 512);
  EXPECT_EQ(info.default_max_new_tokens(), 256);
  grpc::HealthCheckServiceInterface* health = verifier_->server()->GetHealthCheckService();
  ASSERT_NE(health, nullptr);
}

}  // namespace
}  // namespace treespec
