// Scale-out on loopback (issue 4): the real binaries, two drafters and two verifiers with the
// shipped tiny pair on the CPU, each verifier drafting through both drafters (an ipv4: target,
// round-robin with health checks), driven by treespec-loadgen across both verifiers.
//   - ≥ 200 Poisson-timed requests: none fails, both verifiers serve and both drafters get
//     sessions (one per request), and the harness's acceptance figures equal the verifiers'
//     counter deltas (--check_metrics);
//   - SIGTERM to one verifier under load: the requests it was running complete (not fail), it
//     exits 0 having drained, and the other keeps serving the new ones.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/process.h"
#include "tools/loadgen/http_get.h"
#include "tools/loadgen/prometheus_text.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;

const std::string kRoot = TREESPEC_SOURCE_DIR;
const std::string kBin = TREESPEC_BIN_DIR;

// A service started from its binary, with the addresses it printed.
struct Service {
  std::unique_ptr<ChildProcess> process;
  std::string address;  // gRPC HOST:PORT
  std::string metrics;  // /metrics HOST:PORT
};

// Starts `argv` and waits for its "metrics on" and then "listening on" lines.
Service Start(const std::vector<std::string>& argv, const std::string& log) {
  Service s;
  s.process = std::make_unique<ChildProcess>(argv, log);
  const std::string metrics_line = s.process->WaitForLine("metrics on ", 60);
  if (const size_t at = metrics_line.find("metrics on "); at != std::string::npos) {
    s.metrics = metrics_line.substr(at + 11);
  }
  s.address = s.process->WaitForAddress(60);
  return s;
}

// The sum of the samples called `name` on the /metrics at `address` (-1 when unreadable).
double Metric(const std::string& address, const std::string& name) {
  absl::StatusOr<loadgen::HttpUrl> url = loadgen::ParseHttpUrl(address);
  if (!url.ok()) return -1;
  absl::StatusOr<std::string> text = loadgen::HttpGet(*url, absl::Seconds(5));
  if (!text.ok()) return -1;
  absl::StatusOr<std::vector<loadgen::MetricSample>> samples = loadgen::ParsePrometheusText(*text);
  if (!samples.ok()) return -1;
  return loadgen::SumSamples(*samples, name).sum;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return lines;
}

class ScaleOutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/treespec-scale-out-XXXXXX";
    dir_ = mkdtemp(pattern);
    for (int i = 0; i < 2; ++i) {
      drafters_.push_back(
          Start({kBin + "/treespec-drafter", "--port=0", "--metrics_port=0", "--device=cpu",
                 "--threads=1", "--draft_model=" + kRoot + "/models/tiny-draft"},
                absl::StrCat(dir_, "/drafter-", i, ".log")));
      ASSERT_FALSE(drafters_.back().address.empty()) << drafters_.back().process->Stderr();
      ASSERT_FALSE(drafters_.back().metrics.empty());
    }
    const std::string drafter_target =
        absl::StrCat("ipv4:", drafters_[0].address, ",", drafters_[1].address);
    for (int i = 0; i < 2; ++i) {
      verifiers_.push_back(Start({kBin + "/treespec-verifier", "--port=0", "--metrics_port=0",
                                  "--device=cpu", "--model=" + kRoot + "/models/tiny-target",
                                  "--drafter=" + drafter_target, "--drain_seconds=60"},
                                 absl::StrCat(dir_, "/verifier-", i, ".log")));
      ASSERT_FALSE(verifiers_.back().address.empty()) << verifiers_.back().process->Stderr();
      ASSERT_FALSE(verifiers_.back().metrics.empty());
    }
  }

  void TearDown() override {
    for (Service& v : verifiers_) v.process->Signal(SIGTERM);
    for (Service& v : verifiers_) v.process->Wait(60);
    for (Service& d : drafters_) d.process->Signal(SIGTERM);
    for (Service& d : drafters_) EXPECT_EQ(d.process->Wait(60), 0) << d.process->Stderr();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Starts treespec-loadgen with `flags`, across both verifiers unless `target` names one.
  std::unique_ptr<ChildProcess> StartLoadgen(const std::vector<std::string>& flags,
                                             std::string target = "") {
    if (target.empty()) target = absl::StrCat(verifiers_[0].address, ",", verifiers_[1].address);
    std::vector<std::string> argv = {kBin + "/treespec-loadgen", "--target=" + target,
                                     "--progress=false", "--connect_timeout_s=30"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return std::make_unique<ChildProcess>(argv, dir_ + "/loadgen.log");
  }

  std::string dir_;
  std::vector<Service> drafters_, verifiers_;
};

TEST_F(ScaleOutTest, PoissonLoadSpreadsOverAllReplicasAndMatchesTheirCounters) {
  constexpr int kRequests = 240, kWarmups = 4;
  const std::string result = dir_ + "/result.json";
  std::unique_ptr<ChildProcess> loadgen = StartLoadgen(
      {absl::StrCat("--num_prompts=", kRequests), absl::StrCat("--num_warmups=", kWarmups),
       "--request_rate=16", "--arrival=poisson", "--seed=7", "--random_input_len=32",
       "--random_output_len=12", "--random_range_ratio=0.25",
       absl::StrCat("--metrics_urls=", verifiers_[0].metrics, ",", verifiers_[1].metrics),
       "--check_metrics", "--result_json=" + result,
       "--requests_jsonl=" + dir_ + "/requests.jsonl"});
  const absl::Time start = absl::Now();
  const int code = loadgen->Wait(300);
  ASSERT_EQ(code, 0) << loadgen->Stderr();
  std::printf("loadgen: %d requests in %.1f s\n", kRequests,
              absl::ToDoubleSeconds(absl::Now() - start));

  const nlohmann::json summary = ReadJson(result);
  ASSERT_TRUE(summary.is_object()) << "no summary at " << result;
  EXPECT_EQ(summary["completed"], kRequests);
  EXPECT_EQ(summary["failed"], 0) << summary["errors"].dump();
  EXPECT_GT(summary["spec_decode_num_drafts"].get<int64_t>(), 0) << "no speculation happened";
  EXPECT_GT(summary["spec_decode_accepted_tokens"].get<int64_t>(), 0);
  // The cross-check: the verifiers' counter deltas equal the harness's figures.
  const nlohmann::json& check = summary["metrics_check"];
  EXPECT_TRUE(check["ok"].get<bool>()) << check.dump();
  EXPECT_EQ(check["servers"]["spec_decode_num_drafts"].get<double>(),
            summary["spec_decode_num_drafts"].get<double>());
  EXPECT_EQ(check["servers"]["spec_decode_accepted_tokens_per_position"].size(),
            summary["spec_decode_accepted_tokens_per_position"].size());
  // Both verifiers served.
  for (const Service& v : verifiers_) {
    EXPECT_GT(summary["per_target"][v.address]["completed"].get<int>(), kRequests / 4)
        << summary["per_target"].dump();
  }
  // Both drafters drafted: one session per request (warm-ups included), spread over both.
  double sessions = 0;
  for (const Service& d : drafters_) {
    const double s = Metric(d.metrics, "treespec_drafter_sessions_total");
    EXPECT_GT(s, 0) << "drafter " << d.address << " got no session";
    EXPECT_GT(Metric(d.metrics, "treespec_drafter_trees_total"), 0);
    sessions += s;
  }
  EXPECT_EQ(sessions, kRequests + kWarmups);
  std::printf("summary: %s\n", summary.dump().c_str());
}

// Multi-turn conversations with speculation (the draft model) across both verifiers: each
// conversation's turns stay on the verifier that answered its first (session affinity), and
// every later turn reuses at least 90 % of what the earlier turns computed from the prefix cache
// (all but the part of the last page not yet full).
TEST_F(ScaleOutTest, ConversationTurnsReuseTheirCachedPrefixWithSpeculationOn) {
  constexpr int kConversations = 6, kTurns = 4;
  const std::string result = dir_ + "/conversation.json", requests = dir_ + "/conversation.jsonl";
  std::unique_ptr<ChildProcess> loadgen =
      StartLoadgen({"--workload=conversation", absl::StrCat("--conversations=", kConversations),
                    absl::StrCat("--turns=", kTurns), "--history_len=96", "--turn_input_len=24",
                    "--random_output_len=24", "--mode=draft_model", "--num_warmups=2", "--seed=5",
                    "--result_json=" + result, "--requests_jsonl=" + requests});
  ASSERT_EQ(loadgen->Wait(300), 0) << loadgen->Stderr();
  const nlohmann::json summary = ReadJson(result);
  ASSERT_TRUE(summary.is_object());
  EXPECT_EQ(summary["completed"], kConversations * kTurns);
  EXPECT_EQ(summary["failed"], 0) << summary["errors"].dump();
  EXPECT_GT(summary["spec_decode_accepted_tokens"].get<int64_t>(), 0);
  const nlohmann::json& turns = summary["turns"];
  ASSERT_EQ(turns.size(), static_cast<size_t>(kTurns)) << summary.dump();
  EXPECT_EQ(turns[0]["total_cached_tokens"], 0) << "turn 1 shares nothing";
  for (int t = 1; t < kTurns; ++t) {
    EXPECT_EQ(turns[t]["completed"], kConversations);
    EXPECT_GE(turns[t]["reused_share"].get<double>(), 0.9) << turns[t].dump();
  }
  std::map<int, std::set<std::string>> targets;
  for (const nlohmann::json& r : ReadJsonl(requests))
    targets[r["conversation"]].insert(r["target"]);
  ASSERT_EQ(targets.size(), static_cast<size_t>(kConversations));
  std::set<std::string> used;
  for (const auto& [conversation, where] : targets) {
    EXPECT_EQ(where.size(), 1u) << "conversation " << conversation << " moved";
    used.insert(where.begin(), where.end());
  }
  EXPECT_EQ(used.size(), 2u) << "conversations start round-robin over both verifiers";
}

TEST_F(ScaleOutTest, SigtermDrainsOneVerifierWhileTheOtherKeepsServing) {
  constexpr int kRequests = 60, kAfter = 16, kLongTokens = 400, kSeenBeforeSignal = 8;
  const std::string result = dir_ + "/result.json", requests = dir_ + "/requests.jsonl";
  std::unique_ptr<ChildProcess> loadgen =
      StartLoadgen({absl::StrCat("--num_prompts=", kRequests), "--request_rate=5", "--seed=11",
                    "--random_input_len=32", "--random_output_len=48", "--result_json=" + result,
                    "--requests_jsonl=" + requests});
  // Let verifier 0 serve the load for a while.
  Service& drained = verifiers_[0];
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(3) ||
         Metric(drained.metrics, "treespec_requests_total") < 1) {
    ASSERT_LT(absl::Now() - start, absl::Seconds(60)) << "verifier 0 never ended a request";
    absl::SleepFor(absl::Milliseconds(20));
  }
  // A request known to be mid-stream at the signal: speculation off makes it one token per
  // step, so after the first kSeenBeforeSignal tokens it has hundreds of steps left. (A loadgen
  // request seen "running" on /metrics may finish between the scrape and the signal.)
  auto stub0 = v1::Generation::NewStub(
      grpc::CreateChannel(drained.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext long_ctx;
  long_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto long_reader = stub0->Generate(
      &long_ctx,
      testing::TextRequest(testing::CodePrompts()[0], v1::SPECULATION_MODE_OFF, kLongTokens));
  v1::GenerateResponse response;
  size_t long_tokens = 0;
  while (long_tokens < kSeenBeforeSignal && long_reader->Read(&response)) {
    long_tokens += response.token_ids_size();
  }
  ASSERT_GE(long_tokens, kSeenBeforeSignal) << long_reader->Finish().error_message();
  const double signal_unix_s = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  drained.process->Signal(SIGTERM);
  // Draining, verifier 0 takes no new request (UNAVAILABLE, which clients retry elsewhere;
  // once it has exited, the connection is refused: UNAVAILABLE as well) ...
  while (drained.process->Stderr().find("draining: ") == std::string::npos) {
    ASSERT_LT(absl::Now() - start, absl::Seconds(120)) << "verifier 0 did not start draining";
    absl::SleepFor(absl::Milliseconds(10));
  }
  const testing::Outcome refused = testing::Generate(
      stub0.get(), testing::TextRequest("def f(x):\n    return", v1::SPECULATION_MODE_AUTO, 8), 30);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  // ... and new load, all of it sent after the signal (however slow the machine), is served
  // by the other verifier.
  const std::string after_result = dir_ + "/after.json", after_requests = dir_ + "/after.jsonl";
  std::unique_ptr<ChildProcess> after =
      StartLoadgen({absl::StrCat("--num_prompts=", kAfter), "--request_rate=8", "--seed=12",
                    "--random_input_len=32", "--random_output_len=16",
                    "--result_json=" + after_result, "--requests_jsonl=" + after_requests},
                   verifiers_[1].address);
  // The request running at the signal streams to its end.
  while (long_reader->Read(&response)) long_tokens += response.token_ids_size();
  const grpc::Status long_status = long_reader->Finish();
  EXPECT_TRUE(long_status.ok()) << long_status.error_message();
  EXPECT_EQ(long_tokens, static_cast<size_t>(kLongTokens));

  ASSERT_EQ(loadgen->Wait(300), 0) << loadgen->Stderr();
  ASSERT_EQ(after->Wait(300), 0) << after->Stderr();
  EXPECT_EQ(drained.process->Wait(60), 0) << drained.process->Stderr();
  const std::string log = drained.process->Stderr();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("draining: (\\d+) running"))) << log;
  EXPECT_GE(std::stoi(m[1]), 1) << "nothing was running at the signal";
  EXPECT_THAT(log, ::testing::HasSubstr("shutting down: drained"));

  // The load across the signal: nothing failed (requests sent to verifier 0 after the signal
  // were retried on verifier 1).
  const nlohmann::json summary = ReadJson(result);
  ASSERT_TRUE(summary.is_object());
  EXPECT_EQ(summary["completed"], kRequests);
  EXPECT_EQ(summary["failed"], 0) << summary["errors"].dump();
  int drained_ok = 0;
  for (const nlohmann::json& r : ReadJsonl(requests)) {
    const double sent = r["send_unix_s"].get<double>();
    const double ended = sent + r["e2el_ms"].get<double>() / 1e3;
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    // Loadgen requests running on verifier 0 at the signal (often none: they are short).
    if (r["target"] == drained.address && sent < signal_unix_s && ended > signal_unix_s) {
      ++drained_ok;
    }
  }
  // The load after it: served by the other verifier.
  const nlohmann::json after_summary = ReadJson(after_result);
  ASSERT_TRUE(after_summary.is_object());
  EXPECT_EQ(after_summary["completed"], kAfter);
  EXPECT_EQ(after_summary["failed"], 0) << after_summary["errors"].dump();
  int after_ok = 0;
  for (const nlohmann::json& r : ReadJsonl(after_requests)) {
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_GT(r["send_unix_s"].get<double>(), signal_unix_s) << r.dump();
    EXPECT_EQ(r["target"], verifiers_[1].address) << r.dump();
    ++after_ok;
  }
  EXPECT_EQ(after_ok, kAfter);
  std::printf(
      "drained the long request and %d loadgen ones on verifier 0 (%d retried on verifier 1); "
      "%d later ones on verifier 1\n",
      drained_ok, summary["retried_requests"].get<int>(), after_ok);
}

}  // namespace
}  // namespace treespec
