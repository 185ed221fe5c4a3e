// Faults over real gRPC on loopback (issue 5): an in-process verifier (Engine + Generation
// service, the shipped tiny target) whose drafter is a fake Drafter server scripted here. The
// fake sends garbage trees (a parent after its child, token ids out of range, more nodes than
// the budget, wrong step numbers), stalls, sends a message over the verifier's size limit, hangs
// up mid-stream, crashes and comes back on the same port, or refuses every session. Whatever it
// does, the output is plain decoding's; bad trees are counted; broken sessions are reopened
// with a backoff, and speculation resumes. Then the clients' faults: deadlines, concurrent
// cancels, oversized and truncated requests, and a client that never reads its stream.
#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/causal_lm.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/local_verifier.h"
#include "tools/loadgen/prometheus_text.h"
#include "treespec/v1/drafter.grpc.pb.h"
#include "treespec/v1/generation.grpc.pb.h"
#include "verifier_service/engine.h"

namespace treespec {
namespace {

using testing::CodePrompts;
using testing::Generate;
using ::testing::HasSubstr;
using testing::Outcome;

constexpr int kVocab = 4096;    // the tiny target's
constexpr int kChainDepth = 4;  // the fake's good trees: the next 4 tokens of plain decoding
constexpr auto kPatience = std::chrono::seconds(60);  // for conditions (sanitizers, 2 cores)

// Every sequence the fake can continue: prompt + plain decoding output of each request the test
// sends. The fake's good trees are chains of the true next tokens, so the verifier accepts them.
class Oracle {
 public:
  void Add(std::vector<int32_t> prompt, const std::vector<int32_t>& output) {
    prompt.insert(prompt.end(), output.begin(), output.end());
    std::lock_guard<std::mutex> lock(mu_);
    sequences_.push_back(std::move(prompt));
  }
  // Up to `n` tokens that follow `context` in a known sequence (none if it is unknown).
  std::vector<int32_t> Next(const std::vector<int32_t>& context, int n) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::vector<int32_t>& s : sequences_) {
      if (s.size() > context.size() && std::equal(context.begin(), context.end(), s.begin())) {
        const size_t end = std::min(s.size(), context.size() + n);
        return {s.begin() + context.size(), s.begin() + end};
      }
    }
    return {};
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> sequences_;
};

// What the fake drafter does with a commit.
enum class Reply {
  kGood,              // a chain of the true next tokens
  kWrongStep,         // that chain, numbered as the answer to a commit never sent
  kParentAfterChild,  // node 0's parent is node 1
  kTokenOutOfRange,   // an id >= the vocabulary
  kOverBudget,        // one node more than the session's budget
  kStall,             // no answer
  kOversized,         // a tree bigger than the verifier accepts (its message size limit)
  kHangUp,            // ends the stream, status OK, mid-request
  kCrash,             // tells the test to kill the server (and answer nothing meanwhile)
};

v1::DraftResponse Tree(Reply reply, int64_t step, const std::vector<int32_t>& next, int budget) {
  v1::DraftResponse response;
  v1::DraftTree* t = response.mutable_tree();
  t->set_step(reply == Reply::kWrongStep ? step + 1000 : step);
  auto add = [t](int32_t token, int32_t parent) {
    t->add_tokens(token);
    t->add_parents(parent);
    t->add_logprobs(-0.1f);
  };
  const int32_t first = next.empty() ? 5 : next[0];
  switch (reply) {
    case Reply::kGood:
    case Reply::kWrongStep:
      for (size_t i = 0; i < next.size(); ++i) add(next[i], static_cast<int32_t>(i) - 1);
      break;
    case Reply::kParentAfterChild:
      add(first, 1);
      add(first, -1);
      break;
    case Reply::kTokenOutOfRange:
      add(kVocab + 7, -1);
      break;
    case Reply::kOverBudget:
      for (int i = 0; i <= budget; ++i) add(first, -1);
      break;
    case Reply::kOversized:
      for (int i = 0; i < 40000; ++i) add(first, -1);  // ~600 KB (a parent of -1 takes 10)
      break;
    case Reply::kStall:
    case Reply::kHangUp:
    case Reply::kCrash:
      break;
  }
  return response;
}

// One life of the fake drafter: a synchronous service (a thread per stream is fine in a test)
// that answers commits as `script` says, counting sessions and the drafted tokens the verifier
// accepted (a commit of k + 1 tokens accepted k drafted ones).
class FakeDrafter final : public v1::Drafter::Service {
 public:
  // The reply to a session's `commit`-th commit (from 0) in its `session`-th session (from 1).
  // By session and not by step: steps without a session go by in a millisecond here.
  using Script = std::function<Reply(int session, int commit)>;
  FakeDrafter(const Oracle* oracle, Script script, bool refuse = false)
      : oracle_(oracle), script_(std::move(script)), refuse_(refuse) {}

  grpc::Status Draft(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::DraftResponse, v1::DraftRequest>* stream) override {
    int session = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      session = ++sessions_;
    }
    if (refuse_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "drafter crash-looping");
    std::vector<int32_t> context;
    int budget = 16;
    int commits = 0;
    v1::DraftRequest request;
    while (stream->Read(&request)) {
      if (request.has_open()) {
        context.assign(request.open().prompt_ids().begin(), request.open().prompt_ids().end());
        budget = request.open().tree_budget();
        continue;
      }
      const v1::DraftCommit& commit = request.commit();
      context.insert(context.end(), commit.tokens().begin(), commit.tokens().end());
      const Reply reply = script_(session, commits++);
      {
        std::lock_guard<std::mutex> lock(mu_);
        accepted_ += commit.tokens_size() - 1;
        if (reply == Reply::kCrash) crash_requested_ = true;
      }
      cv_.notify_all();
      if (reply == Reply::kHangUp) return grpc::Status::OK;
      if (reply == Reply::kStall || reply == Reply::kCrash) continue;
      stream->Write(Tree(reply, commit.step(), oracle_->Next(context, kChainDepth), budget));
    }
    return grpc::Status::OK;
  }

  int sessions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sessions_;
  }
  int64_t accepted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return accepted_;
  }
  bool WaitForCrashRequest() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] { return crash_requested_; });
  }

 private:
  const Oracle* oracle_;
  const Script script_;
  const bool refuse_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int sessions_ = 0;
  int64_t accepted_ = 0;
  bool crash_requested_ = false;
};

struct FakeServer {
  std::unique_ptr<FakeDrafter> drafter;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Serves `drafter` on 127.0.0.1:`port` (0: a free one), with grpc.health.v1 (the verifier's
// channel only uses drafters that report SERVING).
FakeServer ServeFake(std::unique_ptr<FakeDrafter> drafter, int port) {
  FakeServer fake;
  fake.drafter = std::move(drafter);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &fake.port);
  builder.RegisterService(fake.drafter.get());
  fake.server = builder.BuildAndStart();
  return fake;
}

v1::GenerateRequest IdsRequest(const std::vector<int32_t>& prompt, v1::SpeculationMode mode,
                               int max_new) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  r.mutable_sampling()->set_max_new_tokens(max_new);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_speculation()->set_mode(mode);
  return r;
}

// The value of the metric `name` (summed over its label sets) in a text scrape.
double Metric(const std::string& scrape, const std::string& name) {
  const absl::StatusOr<std::vector<loadgen::MetricSample>> samples =
      loadgen::ParsePrometheusText(scrape);
  EXPECT_TRUE(samples.ok()) << samples.status();
  return samples.ok() ? loadgen::SumSamples(*samples, name).sum : -1;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TinyTarget> target = testing::LoadTinyTarget(8);
    ASSERT_TRUE(target.ok()) << target.status();
    model_ = std::move(target->model);
    tokenizer_ = std::move(target->tokenizer);
  }

  void TearDown() override {
    verifier_.reset();
    if (fake_.server) fake_.server->Shutdown(std::chrono::system_clock::now());
  }

  // The verifier, drafting from the fake on `drafter_port` (0: no drafter), receiving messages
  // up to `max_message_bytes`, and drafts up to 64 KiB. Broken sessions are retried after 20,
  // 40, ... 200 ms.
  void StartVerifier(int drafter_port, int max_message_bytes = 4 << 20) {
    testing::LocalVerifierOptions options;
    if (drafter_port != 0) options.drafter = absl::StrCat("127.0.0.1:", drafter_port);
    options.link.reconnect.initial = absl::Milliseconds(20);
    options.link.reconnect.max = absl::Milliseconds(200);
    options.link.max_message_bytes = 64 << 10;
    options.engine.max_batch = 8;
    options.engine.draft_timeout = absl::Milliseconds(300);  // generous: good trees take ~1 ms
    options.info.model_name = "tiny-target";
    options.info.max_message_bytes = max_message_bytes;
    options.metrics = true;
    verifier_ = std::make_unique<testing::LocalVerifier>(model_.get(), tokenizer_.get(), options);
    ASSERT_TRUE(verifier_->ok());
    stub_ = verifier_->stub();
  }

  std::vector<int32_t> PromptIds(int i) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(CodePrompts()[i]);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{5};
  }

  // Plain decoding of `prompt` (the reference every other run must match), known to the fake.
  std::vector<int32_t> Plain(const std::vector<int32_t>& prompt, int max_new) {
    const Outcome plain = Generate(stub_, IdsRequest(prompt, v1::SPECULATION_MODE_OFF, max_new));
    EXPECT_TRUE(plain.status.ok()) << plain.status.error_message();
    EXPECT_EQ(plain.ids.size(), static_cast<size_t>(max_new));
    oracle_.Add(prompt, plain.ids);
    return plain.ids;
  }

  std::string ScrapeMetrics() { return verifier_->metrics()->Scrape(); }

  Oracle oracle_;
  FakeServer fake_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<testing::LocalVerifier> verifier_;
  v1::Generation::Stub* stub_ = nullptr;  // verifier_'s
};

// One request through every drafter fault in turn. First session: 8 garbage trees (two of each
// kind), a 2-step stall, then a tree over the verifier's message size limit (its client breaks
// the stream). Second: good trees, then a hang-up (the stream ends, status OK). Third: good
// trees, then a crash: the test kills the server and starts a new one on the same port, whose
// trees are good.
TEST_F(FaultTest, DrafterFaultsChangeNoOutputAndBrokenSessionsAreReopened) {
  constexpr int kMaxNew = 400;
  auto first_life = [](int session, int commit) {
    constexpr Reply kGarbage[] = {Reply::kWrongStep, Reply::kParentAfterChild,
                                  Reply::kTokenOutOfRange, Reply::kOverBudget};
    constexpr Reply kLast[] = {Reply::kOversized, Reply::kHangUp, Reply::kCrash};
    if (session == 1 && commit < 8) return kGarbage[commit % 4];
    if (session == 1 && commit < 10) return Reply::kStall;
    if (session > 3 || commit > 10) return Reply::kStall;  // dying
    return commit == 10 ? kLast[session - 1] : Reply::kGood;
  };
  fake_ = ServeFake(std::make_unique<FakeDrafter>(&oracle_, first_life), 0);
  ASSERT_NE(fake_.port, 0);
  StartVerifier(fake_.port);
  const std::vector<int32_t> prompt = PromptIds(1);
  const std::vector<int32_t> plain = Plain(prompt, kMaxNew);

  Outcome spec;
  std::thread client(
      [&] { spec = Generate(stub_, IdsRequest(prompt, v1::SPECULATION_MODE_NGRAM, kMaxNew)); });
  // The crash comes in the third session; without reopening there is none.
  const bool crash_requested = fake_.drafter->WaitForCrashRequest();
  EXPECT_TRUE(crash_requested) << "no third session";
  const int port = fake_.port;
  const int sessions_first_life = fake_.drafter->sessions();
  if (crash_requested) {
    fake_.server->Shutdown(std::chrono::system_clock::now());  // the crash: streams cut
    fake_ = ServeFake(
        std::make_unique<FakeDrafter>(&oracle_, [](int, int) { return Reply::kGood; }), port);
    EXPECT_EQ(fake_.port, port) << "could not restart on the same port";
  }
  client.join();

  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain);
  // Opened, reopened after the oversized tree and after the hang-up; then after the restart.
  EXPECT_EQ(sessions_first_life, 3);
  EXPECT_GE(fake_.drafter->sessions(), 1);
  EXPECT_GT(fake_.drafter->accepted(), 0) << "no speculation after the drafter restarted";
  const std::string metrics = ScrapeMetrics();
  EXPECT_EQ(Metric(metrics, "treespec_spec_bad_trees_total"), 8) << metrics;
  EXPECT_GE(Metric(metrics, "treespec_drafter_session_reopens_total"), 3);
  EXPECT_GE(spec.last.speculation().fallback_steps(), 11);  // garbage, stall, oversized
  EXPECT_GT(spec.last.speculation().accepted_tokens(), fake_.drafter->accepted());
}

// A drafter that fails every session at once (crash-looping) is retried per request after
// growing, jittered delays, not at every step; the requests run on without speculation.
TEST_F(FaultTest, CrashLoopingDrafterIsRetriedWithBackoff) {
  constexpr int kMaxNew = 200;
  fake_ = ServeFake(std::make_unique<FakeDrafter>(
                        &oracle_, [](int, int) { return Reply::kGood; }, true),
                    0);
  ASSERT_NE(fake_.port, 0);
  StartVerifier(fake_.port);
  const std::vector<std::vector<int32_t>> prompts = {PromptIds(2), PromptIds(3)};
  std::vector<std::vector<int32_t>> plain;
  for (const auto& p : prompts) plain.push_back(Plain(p, kMaxNew));

  std::vector<Outcome> spec(prompts.size());
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      spec[i] = Generate(stub_, IdsRequest(prompts[i], v1::SPECULATION_MODE_NGRAM, kMaxNew));
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(spec[i].status.ok()) << spec[i].status.error_message();
    EXPECT_EQ(spec[i].ids, plain[i]);
  }
  // Per request: the first session, then retries after >= 16, 32, 64, 128 ms, then every
  // >= 160 ms (20 ms doubling to the 200 ms cap, less 20 % jitter). One per step would be
  // hundreds.
  const int sessions = fake_.drafter->sessions();
  const double bound = static_cast<double>(prompts.size()) * (5 + seconds / 0.160);
  EXPECT_LE(sessions, bound) << "in " << seconds << " s";
  EXPECT_GT(sessions, static_cast<int>(prompts.size())) << "never retried";
  EXPECT_EQ(Metric(ScrapeMetrics(), "treespec_drafter_session_reopens_total"),
            sessions - static_cast<int>(prompts.size()));
}

// A client deadline cancels the call: the request stops within a step and its KV pages are free
// again.
TEST_F(FaultTest, DeadlineStopsTheRequestAndFreesItsPages) {
  fake_ =
      ServeFake(std::make_unique<FakeDrafter>(&oracle_, [](int, int) { return Reply::kGood; }), 0);
  StartVerifier(fake_.port);
  const v1::ModelInfo before = verifier_->Info();
  ASSERT_EQ(before.kv_pages_free(), before.kv_cache_pages());
  // Plain decoding of 1900 tokens takes seconds here; the deadline comes after 300 ms.
  const Outcome cut =
      Generate(stub_, IdsRequest(PromptIds(0), v1::SPECULATION_MODE_NGRAM, 1900), 0.3);
  const absl::Time deadline_seen = absl::Now();
  EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << cut.status.error_message();
  EXPECT_LT(cut.ids.size(), 1900u);
  ASSERT_TRUE(verifier_->WaitForAllPagesFree());
  // A step takes milliseconds (tens under a sanitizer); running to the end would take seconds.
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - deadline_seen), 1.0);
}

// Many clients cancel at random moments (some by deadline, some by TryCancel) while others run
// to the end: those get plain decoding's output, and every KV page comes back.
TEST_F(FaultTest, ConcurrentCancelsLeaveOtherRequestsUnchanged) {
  constexpr int kMaxNew = 60;
  fake_ =
      ServeFake(std::make_unique<FakeDrafter>(&oracle_, [](int, int) { return Reply::kGood; }), 0);
  StartVerifier(fake_.port);
  std::vector<std::vector<int32_t>> prompts, plain;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(PromptIds(i));
    plain.push_back(Plain(prompts.back(), kMaxNew));
  }
  std::mt19937 rng(17);
  std::vector<Outcome> finished(prompts.size());
  std::vector<grpc::Status> cancelled(8);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      finished[i] = Generate(stub_, IdsRequest(prompts[i], v1::SPECULATION_MODE_AUTO, kMaxNew));
    });
  }
  for (size_t c = 0; c < cancelled.size(); ++c) {
    const int delay_ms = static_cast<int>(rng() % 400);
    const bool by_deadline = c % 2 == 0;
    clients.emplace_back([&, c, delay_ms, by_deadline] {
      const v1::GenerateRequest r =
          IdsRequest(prompts[c % prompts.size()], v1::SPECULATION_MODE_AUTO, 1500);
      if (by_deadline) {
        cancelled[c] = Generate(stub_, r, delay_ms / 1e3).status;
        return;
      }
      grpc::ClientContext ctx;
      auto reader = stub_->Generate(&ctx, r);
      std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        ctx.TryCancel();
      });
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
      }
      cancelled[c] = reader->Finish();
      canceller.join();
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(finished[i].status.ok()) << finished[i].status.error_message();
    EXPECT_EQ(finished[i].ids, plain[i]) << "prompt " << i;
  }
  for (size_t c = 0; c < cancelled.size(); ++c) {
    EXPECT_THAT(cancelled[c].error_code(),
                ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::DEADLINE_EXCEEDED))
        << "client " << c << ": " << cancelled[c].error_message();
  }
  // Every call has ended: what is still running is a leak (cancelled requests stop within a step).
  EXPECT_TRUE(verifier_->WaitForAllPagesFree(absl::Seconds(10)));
}

// A client that never reads its stream: the engine does not wait for it (another request
// finishes meanwhile, and so does its own), and the server holds at most two messages for it,
// merging the rest, so when it finally reads it gets every token in few messages (one message
// per step when everything was queued).
TEST_F(FaultTest, ClientThatNeverReadsStallsNothingAndIsBufferedBoundedly) {
  constexpr int kLong = 600, kShort = 40;
  StartVerifier(0);  // plain decoding only: no drafter is asked
  const std::vector<int32_t> long_prompt = PromptIds(4), short_prompt = PromptIds(5);
  const std::vector<int32_t> long_plain = Plain(long_prompt, kLong);
  const std::vector<int32_t> short_plain = Plain(short_prompt, kShort);

  // Its own connection, with a 16 KiB stream window that does not grow (no bandwidth probes):
  // about 60 messages fill it.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 10);
  auto silent = v1::Generation::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", verifier_->port()), grpc::InsecureChannelCredentials(), args));
  v1::GenerateRequest never_read = IdsRequest(long_prompt, v1::SPECULATION_MODE_OFF, kLong);
  never_read.set_request_id(std::string(kMaxRequestIdBytes, 'n'));  // in every message
  never_read.set_return_text(true);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      silent->Generate(&ctx, never_read);

  const Outcome other = Generate(stub_, IdsRequest(short_prompt, v1::SPECULATION_MODE_OFF, kShort));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.ids, short_plain);
  // The unread request ends in the engine: its steps never waited for its client.
  ASSERT_TRUE(verifier_->WaitForAllPagesFree());

  std::vector<int32_t> ids;
  int messages = 0;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    ++messages;
    ids.insert(ids.end(), response.token_ids().begin(), response.token_ids().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(ids, long_plain);
  EXPECT_LT(messages, kLong / 2) << "one message per step: nothing was merged";
}

// Sends `bytes` as the whole request of Generate, bypassing protobuf, and returns the status.
grpc::Status GenerateWithRawRequest(const std::shared_ptr<grpc::Channel>& channel,
                                    const std::string& bytes) {
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kPatience);
  void* tag = nullptr;
  bool ok = false;
  auto wait = [&] { return cq.Next(&tag, &ok) && ok; };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      generic.PrepareCall(&ctx, "/treespec.v1.Generation/Generate", &cq);
  call->StartCall(nullptr);
  wait();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), nullptr);
  wait();
  grpc::ByteBuffer reply;
  do {
    call->Read(&reply, nullptr);
  } while (wait());
  grpc::Status status;
  call->Finish(&status, nullptr);
  wait();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// The bad-input catalogue (tests/service_test.cc) extended: a request over the size limit, one
// whose bytes end mid-field, and an overlong request id each get a clear status, and the server
// serves the next request.
TEST_F(FaultTest, OversizedTruncatedAndOverlongRequestsGetClearStatuses) {
  constexpr int kLimit = 64 << 10;
  StartVerifier(0, kLimit);
  EXPECT_EQ(verifier_->Info().max_message_bytes(), kLimit);
  const std::vector<int32_t> prompt = PromptIds(0);

  const Outcome big = Generate(
      stub_, testing::TextRequest(std::string(kLimit + 1000, 'x'), v1::SPECULATION_MODE_OFF, 8));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << big.status.error_message();

  v1::GenerateRequest long_id = IdsRequest(prompt, v1::SPECULATION_MODE_OFF, 8);
  long_id.set_request_id(std::string(kMaxRequestIdBytes + 1, 'i'));
  const Outcome refused = Generate(stub_, long_id);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("request_id has 257 bytes"));

  const std::string whole =
      testing::TextRequest(std::string(200, 'y'), v1::SPECULATION_MODE_OFF, 8).SerializeAsString();
  const grpc::Status truncated = GenerateWithRawRequest(verifier_->channel(), whole.substr(0, 100));
  // gRPC's callback server answers a request it cannot parse so, without calling the service.
  EXPECT_EQ(truncated.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(GenerateWithRawRequest(verifier_->channel(), whole).ok());

  const Outcome good = Generate(stub_, IdsRequest(prompt, v1::SPECULATION_MODE_OFF, 8));
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.ids.size(), 8u);
  EXPECT_TRUE(verifier_->WaitForAllPagesFree());
}

}  // namespace
}  // namespace treespec
