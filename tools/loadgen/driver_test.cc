// The driver's cancels against a fake verifier over loopback gRPC. The fake streams one token
// per message at a set pace; each request's prompt scripts it (kDelayMs before the first token,
// kChunk tokens per message, kFail to fail at once). Checked: a cancel before the first token
// and one mid-stream end as cancelled (not failed) with the tokens that had arrived, and the
// server sees both; a before-first-token plan cancels at the first token when that comes
// first; a plan due only at or after the last message lets the request complete; an error that
// comes before the planned cancel is a failure, and the cancel timer does not hold it up; and
// the summary counts the three apart. Under ASan (tools/sanitize.sh) these also guard the
// lifetimes: a timer disarmed while its thread waits on it, and a call released before Run
// returns (when Run could return first, the Driver's channels went before the last call, and
// gRPC 1.51 double-freed its callback completion queue in about one run in three).
#include "tools/loadgen/driver.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/loadgen/serving_stats.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec::loadgen {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Positions in a prompt's token ids that script the fake.
enum Script { kDelayMs = 0, kChunk = 1, kFail = 2, kScriptLen = 3 };
constexpr auto kGap = milliseconds(20);  // between two messages

// Streams prompt.output_len tokens; records, per request id, how many it sent and whether it
// saw the client cancel. Sync API: a test fake, one thread per call is fine.
class FakeVerifier final : public v1::Generation::Service {
 public:
  struct Seen {
    int tokens_sent = 0;
    bool saw_cancel = false;
  };

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    const auto& ids = request->token_ids().ids();
    if (ids.size() < kScriptLen) return {grpc::StatusCode::INVALID_ARGUMENT, "no script"};
    if (ids[kFail] != 0) return {grpc::StatusCode::INTERNAL, "scripted failure"};
    const int total = static_cast<int>(request->sampling().max_new_tokens());
    const int chunk = std::max(1, static_cast<int>(ids[kChunk]));
    Clock::time_point next = Clock::now() + milliseconds(ids[kDelayMs]);
    int sent = 0;
    while (sent < total) {
      // Wait for the next message's time, watching for a cancel.
      while (Clock::now() < next && !context->IsCancelled()) {
        std::this_thread::sleep_for(milliseconds(1));
      }
      if (context->IsCancelled()) {
        Record(request->request_id(), sent, true);
        return grpc::Status::CANCELLED;
      }
      v1::GenerateResponse r;
      r.set_request_id(request->request_id());
      const int n = std::min(chunk, total - sent);
      for (int k = 0; k < n; ++k) r.add_token_ids(7);
      sent += n;
      if (sent == total) {
        r.set_finish_reason(v1::FINISH_REASON_LENGTH);
        r.mutable_usage()->set_prompt_tokens(ids.size());
        r.mutable_usage()->set_completion_tokens(total);
      }
      if (!writer->Write(r)) {
        Record(request->request_id(), sent - n, true);
        return grpc::Status::CANCELLED;
      }
      next = Clock::now() + kGap;
    }
    Record(request->request_id(), sent, false);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_vocab_size(100);
    info->set_context_length(1024);
    return grpc::Status::OK;
  }

  // What the server saw of `request_id`, waiting (up to 10 s) for its handler to end.
  Seen WaitSeen(const std::string& request_id) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return seen_.count(request_id) > 0; });
    return seen_[request_id];
  }

 private:
  void Record(const std::string& id, int sent, bool cancelled) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_[id] = {sent, cancelled};
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Seen> seen_;
};

class DriverCancelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  // A request of `output_len` tokens scripted as the fake reads it.
  static Prompt Scripted(int output_len, int delay_ms, int chunk = 1, bool fail = false) {
    return {.token_ids = {delay_ms, chunk, fail ? 1 : 0}, .output_len = output_len};
  }

  // Sends every prompt at once and returns the results by index.
  RunResult RunAll(const std::vector<Prompt>& prompts, const std::vector<CancelPoint>& cancels) {
    Driver driver({target_});
    return driver.Run(prompts, std::vector<double>(prompts.size(), 0.0), cancels, RequestOptions{},
                      ScheduleOptions{.request_timeout_s = 30}, nullptr);
  }

  FakeVerifier fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(DriverCancelTest, CancelsBeforeTheFirstTokenAndMidStream) {
  const std::vector<Prompt> prompts = {
      Scripted(10, /*delay_ms=*/6000),  // 0: its first token would come after 6 s
      Scripted(10, 0),                  // 1: cancelled once 3 tokens have arrived
      Scripted(10, 0),                  // 2: no cancel planned
  };
  // 500 ms: time for the call to reach the server first, even on a loaded machine.
  const std::vector<CancelPoint> cancels = {{.after_ms = 500}, {.after_tokens = 3}, {}};
  const Clock::time_point start = Clock::now();
  const RunResult run = RunAll(prompts, cancels);
  ASSERT_EQ(run.requests.size(), 3u);
  // The fake would have taken 6 s for request 0: the cancel came well before.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));

  const RequestRecord& before = run.requests[0].record;
  EXPECT_TRUE(before.cancelled);
  EXPECT_FALSE(before.ok);
  EXPECT_EQ(before.output_tokens, 0);
  EXPECT_EQ(run.requests[0].error, "");
  EXPECT_EQ(run.requests[0].cancel.after_ms, 500);

  const RequestRecord& mid = run.requests[1].record;
  EXPECT_TRUE(mid.cancelled);
  // One token per message: cancelled at the third. Messages already in the client's buffers may
  // still be read after TryCancel (a loaded machine lets a few pile up), but not all ten.
  EXPECT_GE(mid.output_tokens, 3);
  EXPECT_LT(mid.output_tokens, 10);

  EXPECT_TRUE(run.requests[2].record.ok);
  EXPECT_FALSE(run.requests[2].record.cancelled);
  EXPECT_EQ(run.requests[2].record.output_tokens, 10);

  const FakeVerifier::Seen s0 = fake_.WaitSeen("loadgen-0");
  EXPECT_TRUE(s0.saw_cancel);
  EXPECT_EQ(s0.tokens_sent, 0);
  const FakeVerifier::Seen s1 = fake_.WaitSeen("loadgen-1");
  EXPECT_TRUE(s1.saw_cancel);
  EXPECT_LT(s1.tokens_sent, 10);
  EXPECT_FALSE(fake_.WaitSeen("loadgen-2").saw_cancel);

  std::vector<RequestRecord> records;
  for (const RequestResult& r : run.requests) records.push_back(r.record);
  const nlohmann::json summary = Summarize(records, run.duration_s, std::vector<double>{99});
  EXPECT_EQ(summary["completed"], 1);
  EXPECT_EQ(summary["failed"], 0);
  EXPECT_EQ(summary["cancelled"], 2);
  EXPECT_EQ(summary["total_output_tokens"], 10);  // the completed request's only
}

TEST_F(DriverCancelTest, ATimedCancelFiresAtTheFirstTokenWhenThatComesSooner) {
  const Clock::time_point start = Clock::now();
  const RunResult run = RunAll({Scripted(200, 0)}, {{.after_ms = 20000}});
  ASSERT_EQ(run.requests.size(), 1u);
  EXPECT_TRUE(run.requests[0].record.cancelled);
  EXPECT_EQ(run.requests[0].record.output_tokens, 1);
  // Neither the 20 s timer nor the 200 tokens (4 s) were waited for.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(fake_.WaitSeen("loadgen-0").saw_cancel);
}

TEST_F(DriverCancelTest, APlanDueOnlyWithTheLastMessageLetsTheRequestComplete) {
  // All 10 tokens come in the final message, so "after 3 tokens" never finds it running.
  const RunResult run = RunAll({Scripted(10, 0, /*chunk=*/10)}, {{.after_tokens = 3}});
  ASSERT_EQ(run.requests.size(), 1u);
  EXPECT_TRUE(run.requests[0].record.ok);
  EXPECT_FALSE(run.requests[0].record.cancelled);
  EXPECT_EQ(run.requests[0].finish_reason, "FINISH_REASON_LENGTH");
  EXPECT_EQ(run.requests[0].cancel.after_tokens, 3);
}

TEST_F(DriverCancelTest, AnErrorBeforeThePlannedCancelIsAFailureAndIsNotHeldUp) {
  const Clock::time_point start = Clock::now();
  const RunResult run = RunAll({Scripted(10, 0, 1, /*fail=*/true)}, {{.after_ms = 5000}});
  ASSERT_EQ(run.requests.size(), 1u);
  const RequestResult& r = run.requests[0];
  EXPECT_FALSE(r.record.ok);
  EXPECT_FALSE(r.record.cancelled);
  EXPECT_EQ(r.error, "INTERNAL: scripted failure");
  // The timer was disarmed when the stream ended: the run did not wait for it.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
}

TEST_F(DriverCancelTest, ManyConcurrentCancelsOfBothKinds) {
  // Timers and token counts racing the stream's end on every request: each ends exactly once,
  // as planned or complete, never failed.
  std::vector<Prompt> prompts;
  std::vector<CancelPoint> cancels;
  for (int i = 0; i < 60; ++i) {
    prompts.push_back(Scripted(4, i % 7, 1 + i % 3));
    if (i % 3 == 0) cancels.push_back({.after_ms = static_cast<double>(i % 40)});
    if (i % 3 == 1) cancels.push_back({.after_tokens = 1 + i % 3});
    if (i % 3 == 2) cancels.push_back({});
  }
  const RunResult run = RunAll(prompts, cancels);
  ASSERT_EQ(run.requests.size(), prompts.size());
  for (const RequestResult& r : run.requests) {
    EXPECT_TRUE(r.record.ok || r.record.cancelled) << r.index << ": " << r.error;
    if (!cancels[r.index].planned()) EXPECT_TRUE(r.record.ok) << r.index;
  }
}

// Follow-ups (conversations' next turns, replacement streams): each scheduled request leads
// to a chain of two more, each sent its delay after the previous one ended; the run returns
// once the last has ended, with every prompt by index. One due after the duration bound is
// never sent.
TEST_F(DriverCancelTest, FollowUpsAreSentAfterTheirDelayAndTheRunWaitsForThem) {
  constexpr double kDelayS = 0.1;
  std::vector<Prompt> prompts = {Scripted(3, 0), Scripted(3, 0)};
  for (int c = 0; c < 2; ++c) {
    prompts[c].conversation = c;
    prompts[c].turn = 1;
  }
  for (const double duration_s : {0.0, 0.05}) {
    ScheduleOptions schedule{.duration_s = duration_s, .request_timeout_s = 30};
    schedule.follow_up = [](const Prompt& p, const RequestResult& r,
                            bool /*sent_all*/) -> std::optional<FollowUp> {
      if (p.turn >= 3 || !r.record.ok) return std::nullopt;
      Prompt next = p;
      ++next.turn;
      return FollowUp{next, kDelayS};
    };
    Driver driver({target_});
    const RunResult run = driver.Run(prompts, {0.0, 0.0}, {}, RequestOptions{}, schedule, nullptr);
    if (duration_s > 0) {
      // Each first request takes >= 40 ms and its follow-up comes 100 ms later: past 50 ms.
      EXPECT_EQ(run.requests.size(), 2u);
      EXPECT_EQ(run.not_sent, 0);
      continue;
    }
    ASSERT_EQ(run.requests.size(), 6u);
    ASSERT_EQ(run.prompts.size(), 6u);
    std::map<std::pair<int, int>, const RequestResult*> by_turn;
    for (const RequestResult& r : run.requests) {
      EXPECT_TRUE(r.record.ok) << r.index << ": " << r.error;
      const Prompt& p = run.prompts[r.index];
      by_turn[{p.conversation, p.turn}] = &r;
    }
    ASSERT_EQ(by_turn.size(), 6u);
    for (int c = 0; c < 2; ++c) {
      for (int turn = 1; turn < 3; ++turn) {
        const RequestResult& before = *by_turn[{c, turn}];
        const RequestResult& after = *by_turn[{c, turn + 1}];
        EXPECT_GE(after.send_s, before.send_s + before.record.e2el_ms / 1e3 + kDelayS - 1e-3)
            << "conversation " << c << " turn " << turn + 1;
      }
    }
  }
}

}  // namespace
}  // namespace treespec::loadgen
