// The real binaries on loopback: treespec-drafter + treespec-verifier with the shipped tiny
// pair. Concurrent streaming clients, a drafter killed mid-run (and what the verifier logs while
// it is down), a drafter stopped mid-run (keepalive), idle links with a short keepalive, a
// verifier hung or killed mid-run, client cancel, SIGTERM, message size and request limits, and
// start-up failures on missing or corrupt model directories.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/keepalive.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/process.h"
#include "tools/loadgen/http_get.h"
#include "tools/loadgen/prometheus_text.h"
#include "treespec/v1/drafter.grpc.pb.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::CodePrompts;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Outcome;
using testing::TextRequest;

const std::string kRoot = TREESPEC_SOURCE_DIR;
const std::string kBin = TREESPEC_BIN_DIR;

std::string TempDir() {
  char pattern[] = "/tmp/treespec-e2e-XXXXXX";
  return mkdtemp(pattern);
}

// The port of a "... metrics on HOST:PORT" line.
int PortOf(const std::string& line) { return std::stoi(line.substr(line.rfind(':') + 1)); }

// The body of GET `path` from 127.0.0.1:`port` (whatever the status), or "" on any failure.
std::string HttpGet(int port, const std::string& path) {
  const absl::StatusOr<loadgen::HttpResponse> answer =
      loadgen::HttpFetch({.host = "127.0.0.1", .port = port, .path = path});
  return answer.ok() ? answer->body : "";
}

Outcome Generate(v1::Generation::Stub* stub, const std::string& text, v1::SpeculationMode mode,
                 int max_new) {
  return testing::Generate(stub, TextRequest(text, mode, max_new));
}

// Both services drain for up to this long: room for a request to finish under a sanitizer
// build (tools/sanitize.sh), where the CPU model runs several times slower.
constexpr int kDrainSeconds = 120;
// The drafter ends sessions whose verifier is silent this long; a running request commits every
// few milliseconds (tens under a sanitizer).
constexpr int kIdleTimeoutS = 5;
constexpr int kMaxMessageBytes = 1 << 20;  // both services' receive limit
// The verifier's limits, off their defaults (GetModelInfo must report them as configured).
constexpr int kMaxQueue = 200;
constexpr int kMaxNewTokensLimit = 1950;

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    logs_ = TempDir();
    StartDrafter(0);
    ASSERT_NE(drafter_metrics_port_, 0) << drafter_->Stderr();
    ASSERT_FALSE(drafter_addr_.empty()) << drafter_->Stderr();
    StartVerifier();
  }

  // (Re)starts the drafter on `port` (0: a free one).
  void StartDrafter(int port) {
    std::vector<std::string> argv = {kBin + "/treespec-drafter",
                                     absl::StrCat("--port=", port),
                                     "--draft_model=" + kRoot + "/models/tiny-draft",
                                     absl::StrCat("--drain_seconds=", kDrainSeconds),
                                     absl::StrCat("--session_idle_timeout_s=", kIdleTimeoutS),
                                     absl::StrCat("--max_message_bytes=", kMaxMessageBytes)};
    if (keepalive_s_ > 0) argv.push_back(absl::StrCat("--keepalive_s=", keepalive_s_));
    drafter_ = std::make_unique<ChildProcess>(argv, logs_ + "/drafter.log");
    const std::string drafter_metrics = drafter_->WaitForLine("metrics on", 60);
    drafter_metrics_port_ = drafter_metrics.empty() ? 0 : PortOf(drafter_metrics);
    drafter_addr_ = drafter_->WaitForAddress(60);
  }

  // (Re)starts the verifier and connects stub_ to it.
  void StartVerifier() {
    std::vector<std::string> argv = {kBin + "/treespec-verifier",
                                     "--port=0",
                                     "--model=" + kRoot + "/models/tiny-target",
                                     "--drafter=" + drafter_addr_,
                                     "--draft_timeout_ms=200",
                                     absl::StrCat("--drain_seconds=", kDrainSeconds),
                                     absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
                                     absl::StrCat("--max_queue=", kMaxQueue),
                                     absl::StrCat("--max_new_tokens_limit=", kMaxNewTokensLimit)};
    if (keepalive_s_ > 0) argv.push_back(absl::StrCat("--keepalive_s=", keepalive_s_));
    verifier_ = std::make_unique<ChildProcess>(argv, logs_ + "/verifier.log");
    // "treespec-verifier metrics on HOST:PORT" comes first, then the listening line.
    const std::string metrics = verifier_->WaitForLine("metrics on", 60);
    ASSERT_FALSE(metrics.empty()) << verifier_->Stderr();
    metrics_port_ = PortOf(metrics);
    addr_ = verifier_->WaitForAddress(60);
    ASSERT_FALSE(addr_.empty()) << verifier_->Stderr();
    stub_ = v1::Generation::NewStub(grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    verifier_->Signal(SIGTERM);
    EXPECT_EQ(verifier_->Wait(30), 0) << verifier_->Stderr();
    drafter_->Signal(SIGTERM);
    drafter_->Wait(30);
    fs::remove_all(logs_);
  }

  std::string logs_, addr_, drafter_addr_;
  int keepalive_s_ = 0;  // both services' --keepalive_s; 0: their default (30)
  int metrics_port_ = 0, drafter_metrics_port_ = 0;
  std::unique_ptr<ChildProcess> drafter_, verifier_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

const std::vector<std::string>& kPrompts = CodePrompts();

TEST_F(E2eTest, ConcurrentStreamingClientsGetPlainDecodingOutput) {
  std::vector<Outcome> plain, spec(kPrompts.size());
  for (const std::string& p : kPrompts)
    plain.push_back(Generate(stub_.get(), p, v1::SPECULATION_MODE_OFF, 48));
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    clients.emplace_back(
        [&, i] { spec[i] = Generate(stub_.get(), kPrompts[i], v1::SPECULATION_MODE_AUTO, 48); });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(spec[i].status.ok()) << spec[i].status.error_message();
    EXPECT_EQ(spec[i].ids, plain[i].ids) << "prompt " << i;
    EXPECT_EQ(spec[i].ids.size(), 48u);
    EXPECT_GT(spec[i].last.speculation().steps(), 0);
  }
}

TEST_F(E2eTest, DrafterKilledMidRunChangesNoOutput) {
  const Outcome plain = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_OFF, 200);
  ASSERT_TRUE(plain.status.ok());
  Outcome spec;
  std::thread client(
      [&] { spec = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_AUTO, 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  drafter_->Signal(SIGKILL);
  client.join();
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain.ids);
  const Outcome after = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_AUTO, 200);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.ids, plain.ids);
}

// The verifier's /metrics endpoint serves Prometheus text: gauges from the start, and a
// request's counts once it ends; the drafter's shows the session that request opened.
TEST_F(E2eTest, MetricsEndpointServesPrometheusText) {
  const std::string before = HttpGet(metrics_port_, "/metrics");
  EXPECT_THAT(before, HasSubstr("treespec_requests_running 0"));
  EXPECT_THAT(before, HasSubstr("# TYPE treespec_time_to_first_token_seconds histogram"));
  const Outcome o = Generate(stub_.get(), kPrompts[2], v1::SPECULATION_MODE_AUTO, 32);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  const std::string after = HttpGet(metrics_port_, "/metrics");
  EXPECT_THAT(after, HasSubstr("treespec_requests_total{reason=\"length\"} 1"));
  EXPECT_THAT(after, HasSubstr("treespec_generation_tokens_total 32"));
  EXPECT_THAT(after, HasSubstr("treespec_time_to_first_token_seconds_count 1"));
  EXPECT_THAT(HttpGet(metrics_port_, "/"), HasSubstr("GET /metrics")) << "the 404 names the path";
  // The drafter drafted that request's trees.
  const std::string drafter = HttpGet(drafter_metrics_port_, "/metrics");
  EXPECT_THAT(drafter, HasSubstr("treespec_drafter_sessions_total 1"));
  EXPECT_THAT(drafter, HasSubstr("# TYPE treespec_drafter_tree_build_seconds histogram"));
}

// Polls grpc.health.v1 at `address` until it says NOT_SERVING (true) or 5 s pass (false).
bool BecomesNotServing(const std::string& address) {
  using grpc::health::v1::HealthCheckResponse;
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 250; ++i) {
    grpc::ClientContext context;
    HealthCheckResponse r;
    if (health->Check(&context, grpc::health::v1::HealthCheckRequest(), &r).ok() &&
        r.status() == HealthCheckResponse::NOT_SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The sum of the samples called `name` on the /metrics at 127.0.0.1:`port` (-1 unreadable).
double Metric(int port, const std::string& name) {
  absl::StatusOr<std::vector<loadgen::MetricSample>> samples =
      loadgen::ParsePrometheusText(HttpGet(port, "/metrics"));
  return samples.ok() && !samples->empty() ? loadgen::SumSamples(*samples, name).sum : -1;
}

// Polls `condition` every 10 ms until it holds (true) or `timeout_s` pass (false).
bool Eventually(const std::function<bool()>& condition, int timeout_s) {
  for (int i = 0; i < timeout_s * 100; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// SIGTERM drains the drafter: its health goes NOT_SERVING, so the verifier opens no new session
// there (a new request runs without drafts, same output), while the session of the request
// already running keeps getting trees until that request ends; then the drafter exits 0.
TEST_F(E2eTest, DrafterSigtermKeepsDraftingRunningSessions) {
  constexpr int kMaxNew = 200;
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, TextRequest(kPrompts[0], v1::SPECULATION_MODE_AUTO, kMaxNew));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // running
  int tokens = response.token_ids_size();
  // Its session is open (the verifier connects to the drafter at its first session, which can
  // take longer than the first step on a loaded machine).
  ASSERT_TRUE(Eventually(
      [&] { return Metric(drafter_metrics_port_, "treespec_drafter_sessions_active") == 1; }, 60));
  drafter_->Signal(SIGTERM);
  ASSERT_TRUE(BecomesNotServing(drafter_addr_));
  const double trees_at_signal = Metric(drafter_metrics_port_, "treespec_drafter_trees_total");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the verifier's health watch

  const Outcome during = Generate(stub_.get(), kPrompts[2], v1::SPECULATION_MODE_AUTO, 8);
  ASSERT_TRUE(during.status.ok()) << during.status.error_message();
  EXPECT_EQ(during.ids, Generate(stub_.get(), kPrompts[2], v1::SPECULATION_MODE_OFF, 8).ids);
  EXPECT_EQ(Metric(drafter_metrics_port_, "treespec_drafter_sessions_total"), 1)
      << "a session was opened on the draining drafter";
  EXPECT_GT(Metric(drafter_metrics_port_, "treespec_drafter_trees_total"), trees_at_signal)
      << "the running session got no trees during the drain";
  EXPECT_EQ(drafter_->Wait(0.05), -1) << "the drafter left before its session ended";

  while (reader->Read(&response)) tokens += response.token_ids_size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, kMaxNew);
  EXPECT_EQ(drafter_->Wait(kDrainSeconds + 30), 0) << drafter_->Stderr();
  EXPECT_THAT(drafter_->Stderr(), HasSubstr("draining 1 sessions"));
  EXPECT_THAT(drafter_->Stderr(), HasSubstr("shutting down: drained"));
}

// SIGTERM drains the verifier: its health goes NOT_SERVING, a new request gets UNAVAILABLE
// (naming the drain), the request already streaming runs to its end, and the process exits 0.
TEST_F(E2eTest, SigtermDrainsRunningRequests) {
  constexpr int kMaxNew = 200;
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, TextRequest(kPrompts[0], v1::SPECULATION_MODE_AUTO, kMaxNew));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // running
  int tokens = response.token_ids_size();
  verifier_->Signal(SIGTERM);

  EXPECT_TRUE(BecomesNotServing(addr_));
  const Outcome refused = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_OFF, 8);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));

  int after_signal = 0;
  while (reader->Read(&response)) {
    tokens += response.token_ids_size();
    after_signal += response.token_ids_size();
  }
  const grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_GT(after_signal, 0) << "the request ended before the signal: nothing was drained";
  EXPECT_EQ(tokens, kMaxNew);
  EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(verifier_->Wait(kDrainSeconds + 30), 0) << verifier_->Stderr();
}

TEST_F(E2eTest, ClientCancelFreesKvPages) {
  auto info = [&] {
    grpc::ClientContext ctx;
    v1::ModelInfo i;
    EXPECT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &i).ok());
    return i;
  };
  v1::GenerateRequest r;
  r.set_text(kPrompts[0]);
  r.mutable_sampling()->set_max_new_tokens(1500);
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, r);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_LT(info().kv_pages_free(), info().kv_cache_pages());
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  v1::ModelInfo after;
  for (int i = 0; i < 500; ++i) {
    after = info();
    if (after.requests_running() == 0 && after.kv_pages_free() == after.kv_cache_pages()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(after.requests_running(), 0);
  EXPECT_EQ(after.kv_pages_free(), after.kv_cache_pages());
}

// A verifier that hangs (SIGSTOP: its connections stay open and silent) loses its drafter
// session after the drafter's --session_idle_timeout_s; one that is killed (its kernel closes
// the connections) loses it at once, without the timeout. The drafter then serves the
// restarted verifier.
TEST_F(E2eTest, HungOrKilledVerifierLosesItsDrafterSessions) {
  const std::string active = "treespec_drafter_sessions_active";
  const std::string reaped = "treespec_drafter_sessions_reaped_total";
  for (const bool hang : {true, false}) {
    SCOPED_TRACE(hang ? "hung verifier" : "killed verifier");
    std::thread client([stub = stub_.get()] {  // ends when the verifier dies
      Generate(stub, kPrompts[0], v1::SPECULATION_MODE_AUTO, 1900);
    });
    EXPECT_TRUE(Eventually([&] { return Metric(drafter_metrics_port_, active) == 1; }, 60));
    const double reaped_before = Metric(drafter_metrics_port_, reaped);
    verifier_->Signal(hang ? SIGSTOP : SIGKILL);
    // Well before the default idle timeout (60 s) and keepalive (30 s + 10 s).
    EXPECT_TRUE(Eventually([&] { return Metric(drafter_metrics_port_, active) == 0; }, 25));
    EXPECT_EQ(Metric(drafter_metrics_port_, reaped), reaped_before + (hang ? 1 : 0));
    if (hang) verifier_->Signal(SIGKILL);
    EXPECT_EQ(verifier_->Wait(30), 128 + SIGKILL);
    client.join();
    StartVerifier();
  }
  EXPECT_THAT(drafter_->Stderr(), HasSubstr("nothing from its verifier"));
  const Outcome after = Generate(stub_.get(), kPrompts[2], v1::SPECULATION_MODE_AUTO, 32);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_GT(after.last.speculation().drafted_tokens(), 0);
}

// Both services refuse a message over --max_message_bytes with RESOURCE_EXHAUSTED (the verifier
// reports its limits, this one, --max_queue and --max_new_tokens_limit, in GetModelInfo) and
// serve the next request.
TEST_F(E2eTest, MessagesOverTheSizeLimitAreRefused) {
  grpc::ClientContext info_context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.max_message_bytes(), kMaxMessageBytes);
  EXPECT_EQ(info.max_queue(), kMaxQueue);
  EXPECT_EQ(info.max_new_tokens_limit(), kMaxNewTokensLimit);
  const Outcome big =
      Generate(stub_.get(), std::string(kMaxMessageBytes + 100, 'x'), v1::SPECULATION_MODE_OFF, 8);
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << big.status.error_message();

  auto drafter =
      v1::Drafter::NewStub(grpc::CreateChannel(drafter_addr_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = drafter->Draft(&context);
  v1::DraftRequest open;
  open.mutable_open()->mutable_prompt_ids()->Resize(kMaxMessageBytes / 2 + 1, 4095);  // 2 B each
  stream->Write(open);
  v1::DraftResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  const Outcome good = Generate(stub_.get(), kPrompts[2], v1::SPECULATION_MODE_AUTO, 16);
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_GT(good.last.speculation().drafted_tokens(), 0);
}

// Sends short speculative requests, one after another, until one is drafted (true) or
// `timeout_s` pass (false): the drafter link is working (again).
bool EventuallyDrafted(v1::Generation::Stub* stub, int timeout_s) {
  return Eventually(
      [&] {
        const Outcome o = Generate(stub, kPrompts[2], v1::SPECULATION_MODE_AUTO, 16);
        return o.status.ok() && o.last.speculation().drafted_tokens() > 0;
      },
      timeout_s);
}

// The lines of `log` at `tag` ('W', 'I', ...) written from `file` that contain `needle`.
int LogLines(const std::string& log, char tag, const std::string& file, const std::string& needle) {
  int n = 0;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == tag && line.find(" " + file + ":") != std::string::npos &&
        line.find(needle) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

// While the drafter is down, the verifier logs one WARNING for the broken link, not one per
// request (the per-request repeats are at DEBUG); once a restarted drafter delivers again, one
// INFO says so.
TEST_F(E2eTest, DrafterDownLogsOneWarningNotOnePerRequest) {
  constexpr int kRequests = 8;
  const std::string file = "drafter_client.cc";
  const Outcome before = Generate(stub_.get(), kPrompts[3], v1::SPECULATION_MODE_AUTO, 16);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  const int port = PortOf(drafter_addr_);
  drafter_->Signal(SIGKILL);
  EXPECT_EQ(drafter_->Wait(30), 128 + SIGKILL);
  for (int i = 0; i < kRequests; ++i) {
    const Outcome o =
        Generate(stub_.get(), kPrompts[i % kPrompts.size()], v1::SPECULATION_MODE_AUTO, 16);
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  }
  EXPECT_EQ(LogLines(verifier_->Stderr(), 'W', file, ""), 1) << verifier_->Stderr();

  StartDrafter(port);
  ASSERT_FALSE(drafter_addr_.empty()) << "could not restart on port " << port;
  EXPECT_TRUE(EventuallyDrafted(stub_.get(), 60));
  const std::string log = verifier_->Stderr();
  EXPECT_EQ(LogLines(log, 'I', file, "deliver again"), 1) << log;
  EXPECT_EQ(LogLines(log, 'W', file, ""), 1) << log;
}

// Both services with --keepalive_s=1: the verifier pings its drafter connections every second
// (and the drafter pings the verifier's).
class E2eKeepaliveTest : public E2eTest {
 protected:
  E2eKeepaliveTest() { keepalive_s_ = 1; }
};

// A drafter that stops answering without closing its connections (SIGSTOP: its kernel still
// acknowledges TCP) is noticed by the verifier's keepalive: the connection is dropped within
// --keepalive_s + kKeepaliveTimeoutS, and the running request's session with it, which is then
// reopened (without keepalive it would wait on the dead stream for as long as the request runs).
// The request's output stays plain decoding's, and the drafter drafts again once it resumes.
TEST_F(E2eKeepaliveTest, StoppedDrafterIsDroppedByKeepaliveAndOutputIsUnchanged) {
  constexpr int kMaxNew = 1900;
  const std::string reopens = "treespec_drafter_session_reopens_total";
  const Outcome plain = Generate(stub_.get(), kPrompts[0], v1::SPECULATION_MODE_OFF, kMaxNew);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  Outcome spec;
  std::thread client(
      [&] { spec = Generate(stub_.get(), kPrompts[0], v1::SPECULATION_MODE_AUTO, kMaxNew); });
  EXPECT_TRUE(Eventually(
      [&] { return Metric(drafter_metrics_port_, "treespec_drafter_sessions_active") == 1; }, 60));
  EXPECT_EQ(Metric(metrics_port_, reopens), 0);

  drafter_->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  const bool dropped = Eventually([&] { return Metric(metrics_port_, reopens) >= 1; }, 40);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - stopped);
  drafter_->Signal(SIGCONT);
  client.join();
  EXPECT_TRUE(dropped) << "the session on the stopped drafter was never dropped";
  // A ping within keepalive_s, its ack overdue kKeepaliveTimeoutS later, then the session's
  // reopen at the request's next commit after a backoff of about 0.1 s.
  EXPECT_LT(seconds, keepalive_s_ + kKeepaliveTimeoutS + 5);
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.ids, plain.ids);
  EXPECT_TRUE(EventuallyDrafted(stub_.get(), 60)) << "no speculation after the drafter resumed";
}

// Pings every second on idle links are answered, not punished: neither a client channel to the
// drafter with the verifier's keepalive settings nor the verifier's own drafter link is sent
// GOAWAY "too_many_pings" (gRPC's default policy allows one ping per 5 minutes, or per 2 hours
// without calls, and drops the connection on the third too early).
TEST_F(E2eKeepaliveTest, IdleLinksWithShortKeepaliveStayUp) {
  // The verifier's link is up (its channel connects at the first session).
  const Outcome first = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_AUTO, 16);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_GT(first.last.speculation().drafted_tokens(), 0);

  grpc::ChannelArguments args;
  SetClientKeepalive(args, keepalive_s_);
  auto channel = grpc::CreateCustomChannel(drafter_addr_, grpc::InsecureChannelCredentials(), args);
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // Ten pings' worth of silence, here with no call open, on the verifier's link with its
  // health watch open (without the server's permission both are dropped within 3-7 s).
  const auto idle_end = std::chrono::system_clock::now() + std::chrono::seconds(10);
  const bool changed = channel->WaitForStateChange(GRPC_CHANNEL_READY, idle_end);
  EXPECT_FALSE(changed) << "the idle connection went " << channel->GetState(false);
  std::this_thread::sleep_until(idle_end);

  EXPECT_THAT(verifier_->Stderr(), Not(HasSubstr("too_many_pings")));
  const Outcome after = Generate(stub_.get(), kPrompts[1], v1::SPECULATION_MODE_AUTO, 16);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_GT(after.last.speculation().drafted_tokens(), 0);
  EXPECT_EQ(Metric(metrics_port_, "treespec_drafter_session_reopens_total"), 0);
}

// Both servers close a connection once it reaches --max_connection_age_s (GOAWAY), so clients
// re-resolve their target and find replicas added since; with 0 the connection stays.
TEST(ConnectionAgeTest, ServersCloseConnectionsPastTheirAge) {
  const std::string logs = TempDir();
  for (const bool drafter : {true, false}) {
    for (const int age_s : {1, 0}) {
      SCOPED_TRACE(absl::StrCat(drafter ? "drafter" : "verifier", ", age ", age_s));
      std::vector<std::string> argv =
          drafter ? std::vector<std::string>{kBin + "/treespec-drafter", "--port=0",
                                             "--metrics_port=-1"}
                  : std::vector<std::string>{kBin + "/treespec-verifier", "--port=0",
                                             "--metrics_port=-1",
                                             "--model=" + kRoot + "/models/tiny-target"};
      argv.push_back(absl::StrCat("--max_connection_age_s=", age_s));
      argv.push_back("--drain_seconds=1");
      ChildProcess server(argv, logs + "/server.log");
      const std::string address = server.WaitForAddress(60);
      ASSERT_FALSE(address.empty()) << server.Stderr();
      auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      auto health = grpc::health::v1::Health::NewStub(channel);
      grpc::ClientContext context;
      grpc::health::v1::HealthCheckResponse response;
      ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
      ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
      // Age 1 s (+ up to 10 % jitter) and a 1 s grace for calls, of which there are none.
      const bool changed = channel->WaitForStateChange(
          GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(4));
      EXPECT_EQ(changed, age_s > 0) << "state now " << channel->GetState(false);
      server.Signal(SIGTERM);
      EXPECT_EQ(server.Wait(30), 0) << server.Stderr();
    }
  }
  fs::remove_all(logs);
}

// Start-up with a bad model directory fails at once, naming the file (and tensor).
class StartupTest : public ::testing::Test {
 protected:
  // Exit status and stderr of a verifier started on `model_dir`.
  std::pair<int, std::string> StartVerifier(const std::string& model_dir) {
    const std::string dir = TempDir();
    ChildProcess p({kBin + "/treespec-verifier", "--port=0", "--model=" + model_dir},
                   dir + "/err.log");
    const int code = p.Wait(60);
    std::string err = p.Stderr();
    fs::remove_all(dir);
    return {code, err};
  }
  // A small random model written by the project's tool.
  std::string RandomModel(const std::string& extra = "") {
    const std::string dir = TempDir();
    const std::string cmd = kBin + "/treespec-random-model --arch=llama --vocab=256 --hidden=64 " +
                            "--intermediate=128 --layers=2 --heads=4 --kv_heads=2 --context=128 " +
                            extra + " --out=" + dir + " > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return dir;
  }
};

TEST_F(StartupTest, MissingDirectoryNamesThePath) {
  auto [code, err] = StartVerifier("/nonexistent/model-dir");
  EXPECT_NE(code, 0);
  EXPECT_THAT(err, HasSubstr("/nonexistent/model-dir"));
}

TEST_F(StartupTest, TruncatedSafetensorsNamesFileAndTensor) {
  const std::string dir = RandomModel();
  const std::string file = dir + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1000);
  auto [code, err] = StartVerifier(dir);
  EXPECT_NE(code, 0);
  EXPECT_THAT(err, HasSubstr("model.safetensors"));
  EXPECT_THAT(err, HasSubstr("lm_head.weight"));  // the last tensor is the one cut short
  fs::remove_all(dir);
}

TEST_F(StartupTest, WrongDtypeNamesFileAndTensor) {
  const std::string dir = RandomModel();
  const std::string file = dir + "/model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(4096, '\0');
  f.read(head.data(), head.size());
  const size_t at = head.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  f.seekp(at);
  f.write("\"I32\"", 5);  // same length: offsets stay valid
  f.close();
  auto [code, err] = StartVerifier(dir);
  EXPECT_NE(code, 0);
  EXPECT_THAT(err, HasSubstr("model.safetensors"));
  EXPECT_THAT(err, HasSubstr("I32"));
  fs::remove_all(dir);
}

TEST_F(StartupTest, ShapeMismatchNamesFileAndTensor) {
  const std::string dir = RandomModel();
  // Claim a wider MLP than the tensors have.
  std::ifstream in(dir + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = config.find("\"intermediate_size\": 128");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, 24, "\"intermediate_size\": 192");
  std::ofstream(dir + "/config.json") << config;
  auto [code, err] = StartVerifier(dir);
  EXPECT_NE(code, 0);
  EXPECT_THAT(err, HasSubstr("model.safetensors"));
  EXPECT_THAT(err, HasSubstr("mlp.gate_proj.weight"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace treespec
