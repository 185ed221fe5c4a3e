// The outbox of one Generate call against a scripted writer: writes go out one at a time, and
// updates that come while the client lags merge into one pending message.
#include "verifier_service/response_outbox.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;

// Records what the outbox sends; the test completes writes by calling OnWriteDone.
class ScriptedWriter final : public ResponseWriter {
 public:
  void Send(const v1::GenerateResponse* response) override { sent.push_back(*response); }
  void Close(const grpc::Status& status) override {
    ++closes;
    last_status = status;
  }
  std::vector<v1::GenerateResponse> sent;
  int closes = 0;
  grpc::Status last_status;
};

GenerationUpdate Tokens(std::vector<int32_t> ids, std::string text) {
  GenerationUpdate u;
  u.token_ids = std::move(ids);
  u.text = std::move(text);
  return u;
}

GenerationUpdate Last(std::vector<int32_t> ids, std::string text) {
  GenerationUpdate u = Tokens(std::move(ids), std::move(text));
  u.finished = true;
  u.finish_reason = FinishReason::kLength;
  u.completion_tokens = 1001;
  u.stats.steps = 1000;
  u.stats.accepted_per_depth = {3, 1};
  return u;
}

// A client that does not read: however many updates come, one message is in flight and one
// pending; once it reads, it gets every token in order and the final fields once.
TEST(ResponseOutboxTest, UpdatesMergeWhileAWriteIsInFlight) {
  ScriptedWriter writer;
  ResponseOutbox outbox(&writer, "r1", nullptr);
  outbox.OnUpdate(Tokens({0}, "a"));
  for (int i = 1; i < 1000; ++i) outbox.OnUpdate(Tokens({i}, "b"));
  outbox.OnUpdate(Last({1000}, "c"));
  ASSERT_EQ(writer.sent.size(), 1u) << "a second write started before the first finished";
  EXPECT_THAT(writer.sent[0].token_ids(), ElementsAre(0));
  outbox.OnWriteDone(true);
  ASSERT_EQ(writer.sent.size(), 2u);
  const v1::GenerateResponse& merged = writer.sent[1];
  ASSERT_EQ(merged.token_ids_size(), 1000);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(merged.token_ids(i), i + 1);
  EXPECT_EQ(merged.text(), std::string(999, 'b') + "c");
  EXPECT_EQ(merged.request_id(), "r1");
  EXPECT_EQ(merged.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(merged.usage().completion_tokens(), 1001);
  EXPECT_EQ(merged.speculation().steps(), 1000);
  EXPECT_THAT(merged.speculation().accepted_per_depth(), ElementsAre(3, 1));
  EXPECT_EQ(writer.closes, 0);
  outbox.OnWriteDone(true);
  EXPECT_EQ(writer.closes, 1);
  EXPECT_TRUE(writer.last_status.ok());
}

// A client that keeps up gets one message per update.
TEST(ResponseOutboxTest, AReadingClientGetsEveryUpdateAsItComes) {
  ScriptedWriter writer;
  ResponseOutbox outbox(&writer, "r2", nullptr);
  for (int i = 0; i < 5; ++i) {
    outbox.OnUpdate(Tokens({i}, "x"));
    outbox.OnWriteDone(true);
  }
  outbox.OnUpdate(Last({}, ""));
  outbox.OnWriteDone(true);
  ASSERT_EQ(writer.sent.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_THAT(writer.sent[i].token_ids(), ElementsAre(i));
  EXPECT_EQ(writer.closes, 1);
}

// Cancelled with tokens pending: the call ends CANCELLED once the write in flight is done; a
// failed request sends what was pending and ends with its status.
TEST(ResponseOutboxTest, CancelAndFailureEndTheCallOnce) {
  ScriptedWriter cancelled;
  ResponseOutbox a(&cancelled, "r3", nullptr);
  a.OnUpdate(Tokens({1}, ""));
  a.OnUpdate(Tokens({2}, ""));
  a.Cancel();
  EXPECT_EQ(cancelled.closes, 0) << "closed with a write in flight";
  a.OnWriteDone(true);
  EXPECT_EQ(cancelled.closes, 1);
  EXPECT_EQ(cancelled.last_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(cancelled.sent.size(), 1u);
  a.OnUpdate(Tokens({3}, ""));
  EXPECT_EQ(cancelled.sent.size(), 1u);

  ScriptedWriter failed;
  ResponseOutbox b(&failed, "r4", nullptr);
  b.OnUpdate(Tokens({1}, ""));
  b.OnUpdate(Tokens({2}, ""));
  GenerationUpdate error;
  error.finished = true;
  error.status = absl::InternalError("verify step failed");
  b.OnUpdate(error);
  b.OnWriteDone(true);
  ASSERT_EQ(failed.sent.size(), 2u);
  EXPECT_THAT(failed.sent[1].token_ids(), ElementsAre(2));
  b.OnWriteDone(true);
  EXPECT_EQ(failed.closes, 1);
  EXPECT_EQ(failed.last_status.error_code(), grpc::StatusCode::INTERNAL);
}

}  // namespace
}  // namespace treespec
