// treespec-feature-wire-bench: what target features cost on the verifier–drafter link.
//
//   treespec-feature-wire-bench [--steps=50] [--tau=6] [--batches=1,16,64] [--json=out.json]
//
// For each target shape (the tiny target: layers 1 and 4 of 256; Qwen3-8B: 5 layers of 4096, as
// its published DFlash drafter reads; a Kimi-K2-class target: 6 layers of 7168) and batch B,
// B sessions of a drafter that reads those features get one commit per step carrying `tau`
// tokens and their `tau` random feature rows, through the verifier's real client
// (GrpcDraftSource) and a real DrafterService on loopback whose drafter drafts one node. Per
// step: the verifier's engine-thread time in DraftStream::Commit (packing rows into parts and
// queueing them), and the round trip until every session's tree for the step is back (the rows
// through gRPC and the drafter service's checks). Bytes per committed token = layers × hidden
// × 2; per step, B × tau times that.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/dtype.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/util/malloc_tuning.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "nlohmann/json.hpp"
#include "verifier_service/drafter_client.h"

ABSL_FLAG(int, steps, 50, "measured steps per configuration (after one warm-up step)");
ABSL_FLAG(int, tau, 6, "tokens (and feature rows) each session commits per step");
ABSL_FLAG(std::string, batches, "1,16,64", "sessions committing each step");
ABSL_FLAG(std::string, json, "", "also write the results here as JSON");

namespace treespec {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Shape {
  std::string name;
  FeatureSpec spec;
};

std::vector<Shape> Shapes() {
  return {{"tiny target (2 x 256)", {{1, 4}, 256, 6, 4096}},
          {"Qwen3-8B (5 x 4096)", {{1, 9, 17, 25, 33}, 4096, 36, 151936}},
          {"Kimi-K2 class (6 x 7168)", {{1, 12, 24, 36, 48, 59}, 7168, 61, 163840}}};
}

// A drafter that reads `spec`'s features and drafts one node: the link's cost, not a model's.
class SinkSession final : public DraftSession {
 public:
  absl::Status Append(const DraftContext&) override { return absl::OkStatus(); }
  absl::StatusOr<DraftedTree> Draft(const SpecLimits&) override {
    return DraftedTree{{1}, {-1}, {0.0f}};
  }
};
class SinkFactory final : public DrafterFactory {
 public:
  explicit SinkFactory(FeatureSpec spec) : spec_(std::move(spec)) {}
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override {
    return std::make_unique<SinkSession>();
  }
  FeatureSpec features() const override { return spec_; }

 private:
  FeatureSpec spec_;
};

// `rows` rows of `width` random finite bf16 values.
TargetFeatures RandomRows(int rows, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TargetFeatures f;
  f.rows = rows;
  f.width = width;
  f.bf16.resize(static_cast<size_t>(rows) * width);
  for (uint16_t& v : f.bf16) v = FloatToBf16Bits(normal(rng));
  return f;
}

struct Result {
  std::string shape;
  int batch = 0, tau = 0;
  double bytes_per_token = 0, bytes_per_step = 0;
  double commit_ms = 0;      // engine-thread time per step, all sessions
  double round_trip_ms = 0;  // first commit to the last tree back, per step
};

absl::StatusOr<Result> Measure(const Shape& shape, int batch, int tau, int steps) {
  DrafterServiceOptions options;
  options.vocab_size = shape.spec.vocab;
  options.worker_threads = 4;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions()));
  drafters.Add(DrafterKind::kDflash, std::make_unique<SinkFactory>(shape.spec));
  DrafterService service(options, std::move(drafters));
  grpc::EnableDefaultHealthCheckService(true);  // the client spreads sessions over SERVING ones
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::InternalError("cannot start the drafter");

  std::mutex mu;
  std::condition_variable arrived;
  Result r;
  {
    GrpcDraftSource source(absl::StrCat("127.0.0.1:", port));
    const std::vector<int32_t> prompt = {3, 4, 5, 6, 7, 8, 9, 10};
    std::vector<std::unique_ptr<DraftStream>> streams;
    for (int b = 0; b < batch; ++b) {
      DraftOpenParams open;
      open.request_id = absl::StrCat("bench-", b);
      open.prompt = prompt;
      open.mode = SpecMode::Of(DrafterKind::kDflash);
      open.limits = {1, 1, 0};
      open.feature_layers = shape.spec.layers;
      streams.push_back(source.Open(open, [&] {
        std::lock_guard<std::mutex> lock(mu);
        arrived.notify_all();
      }));
    }
    const TargetFeatures prompt_rows =
        RandomRows(static_cast<int>(prompt.size()), shape.spec.width(), 1);
    const TargetFeatures step_rows = RandomRows(tau, shape.spec.width(), 2);
    const std::vector<int32_t> step_tokens(tau, 11);
    // Waits for every session's tree of `step`; false after 60 s.
    auto await_trees = [&](int64_t step) {
      std::vector<bool> got(batch, false);
      int left = batch;
      std::unique_lock<std::mutex> lock(mu);
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      while (left > 0) {
        for (int b = 0; b < batch; ++b) {
          if (!got[b] && streams[b]->TakeTree(step).has_value()) {
            got[b] = true;
            --left;
          }
          if (streams[b]->broken()) return false;
        }
        if (left > 0 && arrived.wait_until(lock, deadline) == std::cv_status::timeout) return false;
      }
      return true;
    };
    for (auto& s : streams) s->Commit(0, DraftContext{{11}, prompt_rows}, 0);
    if (!await_trees(0)) return absl::DeadlineExceededError("no tree for the prompt's commit");
    Clock::duration commit{}, round_trip{};
    for (int step = 1; step <= steps + 1; ++step) {
      const auto start = Clock::now();
      for (auto& s : streams) s->Commit(step, DraftContext{step_tokens, step_rows}, 0);
      const auto committed = Clock::now();
      if (!await_trees(step)) return absl::DeadlineExceededError(absl::StrCat("step ", step));
      if (step == 1) continue;  // warm-up
      commit += committed - start;
      round_trip += Clock::now() - start;
    }
    r.shape = shape.name;
    r.batch = batch;
    r.tau = tau;
    r.bytes_per_token = shape.spec.width() * 2.0;
    r.bytes_per_step = r.bytes_per_token * tau * batch;
    r.commit_ms = Ms(commit) / steps;
    r.round_trip_ms = Ms(round_trip) / steps;
  }
  server->Shutdown(std::chrono::system_clock::now());
  return r;
}

int Run() {
  const int steps = absl::GetFlag(FLAGS_steps);
  const int tau = absl::GetFlag(FLAGS_tau);
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < 1) {
      std::fprintf(stderr, "--batches: '%s' is not a positive integer\n", std::string(b).c_str());
      return 2;
    }
    batches.push_back(v);
  }
  if (steps < 1 || tau < 1) {
    std::fprintf(stderr, "--steps and --tau must be >= 1\n");
    return 2;
  }
  std::vector<Result> results;
  std::printf("%-26s %5s %12s %12s %11s %13s %12s\n", "target", "batch", "B/token", "KB/step",
              "commit ms", "round trip ms", "link GB/s");
  for (const Shape& shape : Shapes()) {
    for (int batch : batches) {
      absl::StatusOr<Result> r = Measure(shape, batch, tau, steps);
      if (!r.ok()) {
        std::fprintf(stderr, "%s, batch %d: %s\n", shape.name.c_str(), batch,
                     r.status().ToString().c_str());
        return 1;
      }
      std::printf("%-26s %5d %12.0f %12.1f %11.3f %13.3f %12.2f\n", r->shape.c_str(), r->batch,
                  r->bytes_per_token, r->bytes_per_step / 1024, r->commit_ms, r->round_trip_ms,
                  r->bytes_per_step / (r->round_trip_ms * 1e-3) / 1e9);
      results.push_back(*r);
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Result& r : results) {
      out.push_back({{"target", r.shape},
                     {"batch", r.batch},
                     {"tau", r.tau},
                     {"bytes_per_token", r.bytes_per_token},
                     {"bytes_per_step", r.bytes_per_step},
                     {"commit_ms", r.commit_ms},
                     {"round_trip_ms", r.round_trip_ms}});
    }
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace treespec

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("time target features on the verifier-drafter link");
  treespec::KeepLargeBuffersInHeap();  // as the services do
  absl::ParseCommandLine(argc, argv);
  return treespec::AfterGrpcShutdown(treespec::Run());
}
