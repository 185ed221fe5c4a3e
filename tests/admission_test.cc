// Admission runs off gRPC's callback threads, which also answer health checks: requests whose
// prompts are slow to tokenize, or far over the context, never keep a health probe waiting
// (a probe past its timeout gets a healthy verifier restarted), and a text far over the context
// is refused without being tokenized whole.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/local_verifier.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;
using testing::Outcome;

// The real tokenizer, `delay` slower per text.
class SlowTokenizer final : public Tokenizer {
 public:
  SlowTokenizer(const Tokenizer* inner, absl::Duration delay) : inner_(inner), delay_(delay) {}
  absl::StatusOr<std::vector<int32_t>> EncodeAtMost(const std::string& text,
                                                    size_t max_tokens) const override {
    absl::SleepFor(delay_);
    return inner_->EncodeAtMost(text, max_tokens);
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    return inner_->Decode(ids);
  }
  int vocab_size() const override { return inner_->vocab_size(); }
  int32_t TokenToId(const std::string& token) const override { return inner_->TokenToId(token); }

 private:
  const Tokenizer* inner_;
  const absl::Duration delay_;
};

// Sends `requests` from one thread each and, until they are all answered, asks the verifier's
// health every 20 ms; returns the slowest health answer and fills `outcomes`.
absl::Duration SlowestHealthCheckDuring(testing::LocalVerifier& verifier,
                                        const std::vector<v1::GenerateRequest>& requests,
                                        std::vector<Outcome>* outcomes) {
  outcomes->assign(requests.size(), Outcome());
  std::atomic<int> pending{static_cast<int>(requests.size())};
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      (*outcomes)[i] = testing::Generate(verifier.stub(), requests[i], 120);
      --pending;
    });
  }
  auto health = grpc::health::v1::Health::NewStub(verifier.channel());
  absl::Duration slowest;
  while (pending > 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::health::v1::HealthCheckResponse response;
    const absl::Time start = absl::Now();
    EXPECT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
    slowest = std::max(slowest, absl::Now() - start);
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : clients) t.join();
  return slowest;
}

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TinyTarget> target = testing::LoadTinyTarget(8);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
  }
  testing::TinyTarget target_;
};

// 16 prompts that take 300 ms each to tokenize (4.8 s of tokenizing, two at a time): with
// tokenizing on the callback threads, health answers waited for them.
TEST_F(AdmissionTest, HealthChecksStayFastWhilePromptsAreTokenized) {
  SlowTokenizer slow(target_.tokenizer.get(), absl::Milliseconds(300));
  testing::LocalVerifier verifier(target_.model.get(), &slow, {});
  ASSERT_TRUE(verifier.ok());
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 16; ++i) {
    const std::string& code = testing::CodePrompts()[i % testing::CodePrompts().size()];
    requests.push_back(testing::TextRequest(code, v1::SPECULATION_MODE_OFF, 4));
  }
  std::vector<Outcome> outcomes;
  const absl::Duration slowest = SlowestHealthCheckDuring(verifier, requests, &outcomes);
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.ids.size(), 4u);
  }
  EXPECT_LT(slowest, absl::Seconds(1)) << "a health check waited for tokenizing";
}

// 8 texts of 3 MB (under the 4 MiB message limit, about a million tokens each, against a
// 2048-token context) are refused at once, naming the context; health never waits on them.
TEST_F(AdmissionTest, TextsFarOverTheContextAreRefusedWithoutTokenizingThemWhole) {
  testing::LocalVerifier verifier(target_.model.get(), target_.tokenizer.get(), {});
  ASSERT_TRUE(verifier.ok());
  std::string huge;
  while (huge.size() < (3u << 20)) huge += testing::CodePrompts()[huge.size() % 4] + "\n";
  std::vector<v1::GenerateRequest> requests(
      8, testing::TextRequest(huge, v1::SPECULATION_MODE_OFF, 4));
  std::vector<Outcome> outcomes;
  const absl::Duration slowest = SlowestHealthCheckDuring(verifier, requests, &outcomes);
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(o.status.error_message(),
                HasSubstr("text is longer than 2047 tokens, but the context length is 2048"));
  }
  EXPECT_LT(slowest, absl::Seconds(1));
  // The server still serves.
  const Outcome ok = testing::Generate(
      verifier.stub(),
      testing::TextRequest(testing::CodePrompts()[0], v1::SPECULATION_MODE_OFF, 4));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

}  // namespace
}  // namespace treespec
