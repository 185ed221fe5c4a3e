// The Drafter service over real gRPC on loopback: an in-process server on port 0.
#include "drafter_service/drafter_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/model/dtype.h"
#include "common/rpc/draft_context_proto.h"
#include "common/rpc/spec_limits_proto.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/ngram_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "treespec/v1/drafter.grpc.pb.h"

namespace treespec {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Stream = grpc::ClientReaderWriter<v1::DraftRequest, v1::DraftResponse>;

constexpr int kVocab = 512;  // SmallLlamaConfig's

class DrafterServiceTest : public ::testing::Test {
 protected:
  void Start(bool with_draft_model, DrafterKind default_kind = DrafterKind::kNgram,
             absl::Duration idle_timeout = absl::Seconds(60),
             std::unique_ptr<DrafterFactory> dflash = nullptr) {
    DrafterServiceOptions options;
    options.default_kind = default_kind;
    options.session_idle_timeout = idle_timeout;
    options.vocab_size = kVocab;
    options.worker_threads = 2;
    DrafterRegistry drafters;
    drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions{}));
    if (with_draft_model) {
      const ModelConfig config = testing::SmallLlamaConfig();
      absl::StatusOr<std::unique_ptr<CausalLm>> lm =
          CreateCpuCausalLm(config, testing::RandomWeights(config, 11), LmOptions{});
      ASSERT_TRUE(lm.ok()) << lm.status();
      drafters.Add(DrafterKind::kDraftModel,
                   std::make_unique<DraftModelDrafterFactory>(*std::move(lm), DraftModelOptions{}));
    }
    if (dflash != nullptr) drafters.Add(DrafterKind::kDflash, std::move(dflash));
    ASSERT_TRUE(ValidateDrafterServiceOptions(options, drafters).ok());
    service_ = std::make_unique<DrafterService>(options, std::move(drafters), &metrics_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::Drafter::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Waits until every session on the server has ended.
  bool WaitForNoSessions() {
    for (int i = 0; i < 500 && service_->active_sessions() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return service_->active_sessions() == 0;
  }

  static v1::DraftRequest Open(const std::vector<int32_t>& prompt,
                               v1::SpeculationMode mode = v1::SPECULATION_MODE_NGRAM,
                               int budget = 0, int depth = 0) {
    v1::DraftRequest r;
    r.mutable_open()->set_request_id("test");
    r.mutable_open()->mutable_prompt_ids()->Assign(prompt.begin(), prompt.end());
    r.mutable_open()->set_mode(mode);
    r.mutable_open()->set_tree_budget(budget);
    r.mutable_open()->set_max_depth(depth);
    return r;
  }

  static v1::DraftRequest Commit(int64_t step, const std::vector<int32_t>& tokens) {
    v1::DraftRequest r;
    r.mutable_commit()->set_step(step);
    r.mutable_commit()->mutable_tokens()->Assign(tokens.begin(), tokens.end());
    return r;
  }

  // Sends `first` (and then `second` if given) and returns the status the stream ends with;
  // no tree comes (a DraftOpened may, when `first` was a good open).
  grpc::Status ExpectFailure(const v1::DraftRequest& first,
                             const v1::DraftRequest* second = nullptr) {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
    stream->Write(first);
    if (second != nullptr) stream->Write(*second);
    v1::DraftResponse response;
    while (stream->Read(&response)) {
      EXPECT_EQ(response.kind_case(), v1::DraftResponse::kOpened);
    }
    return stream->Finish();
  }

  // Reads a session's first response, which states the limits it runs under.
  static v1::DraftOpened ReadOpened(Stream* stream) {
    v1::DraftResponse response;
    EXPECT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.kind_case(), v1::DraftResponse::kOpened);
    return response.opened();
  }

  DrafterMetrics metrics_;  // before service_: outlives it
  std::unique_ptr<DrafterService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Drafter::Stub> stub_;
};

// A drafter that takes target features (layers 0 and 1 of a 4-layer target, hidden 2) and
// drafts one node saying what it holds: its token is the number of feature rows received, its
// log-probability the last value of the newest row.
class FeatureCountingSession final : public DraftSession {
 public:
  absl::Status Append(const DraftContext& added) override {
    rows_.Append(added.features);
    return absl::OkStatus();
  }
  absl::StatusOr<DraftedTree> Draft(const SpecLimits&) override {
    DraftedTree tree;
    tree.tokens = {rows_.rows};
    tree.parents = {-1};
    tree.logprobs = {rows_.empty() ? 0.0f
                                   : Bf16BitsToFloat(rows_.bf16[rows_.rows * rows_.width - 1])};
    return tree;
  }

 private:
  TargetFeatures rows_;
};

class FeatureCountingFactory final : public DrafterFactory {
 public:
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override {
    return std::make_unique<FeatureCountingSession>();
  }
  FeatureSpec features() const override { return {{0, 1}, 2, 4, kVocab}; }
};

// `rows` feature rows of width `width`, row r column c holding r + 1 + c / 4.
v1::DraftRequest WithFeatures(v1::DraftRequest commit, int rows, int width) {
  DraftContext c;
  c.tokens.assign(commit.commit().tokens().begin(), commit.commit().tokens().end());
  c.features.rows = rows;
  c.features.width = rows > 0 ? width : 0;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < width; ++i) c.features.bf16.push_back(FloatToBf16Bits(r + 1.0f + i / 4.0f));
  }
  ToProto(c, commit.mutable_commit());
  return commit;
}

std::vector<int32_t> Repetitive(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> phrase(7);
  for (int32_t& t : phrase) t = static_cast<int32_t>(rng() % kVocab);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(phrase[i % phrase.size()]);
  return out;
}

TEST_F(DrafterServiceTest, OpenCommitTreeRoundTripWithNgram) {
  Start(false);
  const std::vector<int32_t> prompt = Repetitive(30, 1);
  NgramDraftSession reference(NgramOptions{});
  ASSERT_TRUE(reference.Append(TokenContext(prompt)).ok());

  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
  ASSERT_TRUE(stream->Write(Open(prompt, v1::SPECULATION_MODE_NGRAM, 12, 5)));
  const v1::DraftOpened opened = ReadOpened(stream.get());
  EXPECT_EQ(FromProto(opened.limits()), (SpecLimits{12, 5, 0}));
  EXPECT_EQ(opened.drafter().drafter_id(), service_->info().drafter_id());
  EXPECT_FALSE(opened.drafter().drafter_id().empty());
  EXPECT_EQ(FromProto(opened.drafter().max()), (SpecLimits{512, 64, 512}));
  std::mt19937 rng(5);
  for (int step = 0; step < 10; ++step) {
    // Alternate accepted runs that follow the pattern with a surprise token.
    std::vector<int32_t> tokens = {prompt[(30 + step) % 7]};
    if (step % 3 == 2) tokens.push_back(static_cast<int32_t>(rng() % kVocab));
    ASSERT_TRUE(stream->Write(Commit(step, tokens)));
    v1::DraftResponse response;
    ASSERT_TRUE(stream->Read(&response));
    ASSERT_TRUE(reference.Append(TokenContext(tokens)).ok());
    DraftedTree want = *reference.Draft(SpecLimits{12, 5});
    EXPECT_EQ(response.tree().step(), step);
    EXPECT_THAT(response.tree().tokens(), ElementsAreArray(want.tokens));
    EXPECT_THAT(response.tree().parents(), ElementsAreArray(want.parents));
    EXPECT_THAT(response.tree().logprobs(), ElementsAreArray(want.logprobs));
  }
  ASSERT_TRUE(stream->WritesDone());
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(WaitForNoSessions());
  EXPECT_EQ(service_->total_sessions(), 1);
  // The metrics saw the session and its trees (every commit was answered, none went stale).
  const std::string text = metrics_.Scrape();
  EXPECT_THAT(text, HasSubstr("treespec_drafter_sessions_total 1\n"));
  EXPECT_THAT(text, HasSubstr("treespec_drafter_sessions_active 0\n"));
  EXPECT_THAT(text, HasSubstr("treespec_drafter_trees_total 10\n"));
  EXPECT_THAT(text, HasSubstr("treespec_drafter_tree_build_seconds_count 10\n"));
  EXPECT_THAT(text, HasSubstr("treespec_drafter_stale_steps_total 0\n"));
  // Every tree (and the session's opening) went through the drafting threads' queue, and
  // none waits now.
  const std::string count_key = "treespec_drafter_tree_queue_seconds_count ";
  const size_t at = text.find(count_key);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GE(std::stoi(text.substr(at + count_key.size())), 10);
  EXPECT_THAT(text, HasSubstr("treespec_drafter_queued_trees 0\n"));
}

TEST_F(DrafterServiceTest, AutoUsesDefaultsAndHalfCloseFlushesPendingCommits) {
  Start(false);
  const std::vector<int32_t> prompt = Repetitive(40, 2);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
  ASSERT_TRUE(stream->Write(Open(prompt, v1::SPECULATION_MODE_AUTO)));
  // Three commits at once, then half-close: every commit is answered (stale ones may be
  // empty), the last one with the real tree, then the stream ends OK.
  for (int step = 0; step < 3; ++step)
    ASSERT_TRUE(stream->Write(Commit(step, {prompt[(40 + step) % 7]})));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::DraftResponse> responses;
  v1::DraftResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), 4u);
  // Default limits: budget 16, depth 8; one repeating phrase: a chain of 8.
  EXPECT_EQ(FromProto(responses[0].opened().limits()), (SpecLimits{16, 8, 0}));
  for (int step = 0; step < 3; ++step) EXPECT_EQ(responses[step + 1].tree().step(), step);
  EXPECT_EQ(responses[3].tree().tokens_size(), 8);
}

// A message whose bytes are not a DraftRequest ends the stream with INVALID_ARGUMENT naming the
// message, after what came before it was answered: not with OK, which would read as the
// verifier's own half-close and leave its later commits unanswered without an error.
TEST_F(DrafterServiceTest, AnUndecodableMessageEndsTheStreamWithInvalidArgument) {
  Start(false);
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  int next_tag = 0;
  auto wait = [&] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      generic.PrepareCall(&ctx, "/treespec.v1.Drafter/Draft", &cq);
  call->StartCall(&next_tag);
  ASSERT_TRUE(wait());
  auto serialize = [](const v1::DraftRequest& message) {
    grpc::ByteBuffer buffer;
    bool own = false;
    EXPECT_TRUE(
        grpc::SerializationTraits<v1::DraftRequest>::Serialize(message, &buffer, &own).ok());
    return buffer;
  };
  const std::vector<int32_t> prompt = Repetitive(30, 4);
  call->Write(serialize(Open(prompt)), &next_tag);
  ASSERT_TRUE(wait());
  call->Write(serialize(Commit(0, {prompt[2]})), &next_tag);
  ASSERT_TRUE(wait());
  const char garbage[] = "\xff\xff\xff\xff";  // a field tag that never ends
  grpc::Slice slice(garbage, sizeof(garbage) - 1);
  call->Write(grpc::ByteBuffer(&slice, 1), &next_tag);
  wait();  // may fail once the drafter has ended the stream
  call->WritesDone(&next_tag);
  wait();
  int answers = 0;
  for (grpc::ByteBuffer response;; ++answers) {
    call->Read(&response, &next_tag);
    if (!wait()) break;
  }
  EXPECT_LE(answers, 2);  // DraftOpened and, if drafted before the garbage, the first tree
  grpc::Status status;
  call->Finish(&status, &next_tag);
  ASSERT_TRUE(wait());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("message 3 of the Draft stream is not a DraftRequest"));
  EXPECT_TRUE(WaitForNoSessions());
}

TEST_F(DrafterServiceTest, FirstMessageMustBeOpen) {
  Start(false);
  grpc::Status status = ExpectFailure(Commit(0, {1}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "first message must be open");
  status = ExpectFailure(v1::DraftRequest{});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "first message must be open");
}

TEST_F(DrafterServiceTest, BadModesGetClearStatuses) {
  Start(false);
  grpc::Status status = ExpectFailure(Open({1, 2}, v1::SPECULATION_MODE_DRAFT_MODEL));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "mode DRAFT_MODEL is not served by this drafter (it serves NGRAM); use one of those, "
            "or a drafter with --draft_model=DIR");
  status = ExpectFailure(Open({1, 2}, v1::SPECULATION_MODE_OFF));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("mode OFF"));
  status = ExpectFailure(Open({1, 2}, v1::SPECULATION_MODE_DFLASH));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("mode DFLASH is not served by this drafter"));
  status = ExpectFailure(Open({1, 2}, static_cast<v1::SpeculationMode>(42)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "unknown speculation mode 42; use AUTO or one of the kinds served: NGRAM");
}

// The options name what a default kind needs when nothing serves it.
TEST(DrafterServiceOptionsTest, DefaultKindMustBeServed) {
  DrafterServiceOptions options;
  DrafterRegistry drafters;
  EXPECT_EQ(ValidateDrafterServiceOptions(options, drafters).message(), "no drafter kind to serve");
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions{}));
  EXPECT_TRUE(ValidateDrafterServiceOptions(options, drafters).ok());
  options.default_kind = DrafterKind::kDraftModel;
  EXPECT_EQ(ValidateDrafterServiceOptions(options, drafters).message(),
            "--default_mode=draft_model needs --draft_model=DIR; or use one of the kinds served: "
            "ngram");
}

// A session asking more than the drafter serves runs at its maxima, and says so; GetInfo
// states the same maxima and the kinds served.
TEST_F(DrafterServiceTest, LimitsAboveTheMaximaAreServedAtTheMaximaAndStated) {
  Start(true);
  grpc::ClientContext info_ctx;
  v1::DrafterInfo info;
  ASSERT_TRUE(stub_->GetInfo(&info_ctx, v1::DrafterInfoRequest(), &info).ok());
  EXPECT_EQ(FromProto(info.defaults()), (SpecLimits{16, 8, 0}));
  EXPECT_EQ(FromProto(info.max()), (SpecLimits{512, 64, 512}));
  EXPECT_THAT(info.modes(),
              ElementsAre(v1::SPECULATION_MODE_NGRAM, v1::SPECULATION_MODE_DRAFT_MODEL));
  EXPECT_EQ(info.drafter_id(), service_->info().drafter_id());

  const std::vector<int32_t> prompt = Repetitive(30, 9);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
  v1::DraftRequest open = Open(prompt, v1::SPECULATION_MODE_NGRAM, 1000, 0);
  open.mutable_open()->set_top_k(5000);
  ASSERT_TRUE(stream->Write(open));
  EXPECT_EQ(FromProto(ReadOpened(stream.get()).limits()), (SpecLimits{512, 8, 512}));
  ASSERT_TRUE(stream->Write(Commit(0, {prompt[30 % 7]})));
  v1::DraftResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.tree().step(), 0);
  EXPECT_GT(response.tree().tokens_size(), 0);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DrafterServiceTest, BadLimitsAndTokenIds) {
  Start(false);
  grpc::Status status = ExpectFailure(Open({1, 2}, v1::SPECULATION_MODE_NGRAM, 0, -1));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("limits must be >= 0 (0 = the drafter's default); got tree_budget unset, "
                        "max_depth -1"));

  // Request ids: at most 256 bytes of UTF-8 (every log line of the session carries the id).
  v1::DraftRequest long_id = Open({1, 2});
  long_id.mutable_open()->set_request_id(std::string(kMaxDraftRequestIdBytes + 1, 'i'));
  status = ExpectFailure(long_id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("open.request_id has 257 bytes; at most 256"));
  v1::DraftRequest bad_utf8 = Open({1, 2});
  bad_utf8.mutable_open()->set_request_id("ok\xff\xfe");
  status = ExpectFailure(bad_utf8);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("open.request_id is not valid UTF-8 (byte 2)"));

  status = ExpectFailure(Open({1, 2, 5000}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("prompt token id 5000 at index 2 out of range [0, 512)"));
  status = ExpectFailure(Open({-1}));
  EXPECT_THAT(status.error_message(), HasSubstr("token id -1 at index 0"));

  v1::DraftRequest commit = Commit(3, {7, 512});
  status = ExpectFailure(Open({1, 2}), &commit);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("commit step 3: token id 512 at index 1 out of range [0, 512)"));
  commit = Commit(4, {});
  status = ExpectFailure(Open({1, 2}), &commit);
  EXPECT_THAT(status.error_message(), HasSubstr("commit step 4 carries no tokens"));
  commit = Commit(5, {7});
  commit.mutable_commit()->set_tree_budget(-2);
  status = ExpectFailure(Open({1, 2}), &commit);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("commit step 5: tree_budget is -2"));
  v1::DraftRequest second_open = Open({3});
  status = ExpectFailure(Open({1, 2}), &second_open);
  EXPECT_THAT(status.error_message(), HasSubstr("open sent twice"));
  EXPECT_TRUE(WaitForNoSessions());
}

TEST_F(DrafterServiceTest, ConcurrentSessions) {
  Start(false);
  const int kSessions = 12, kSteps = 15;
  std::vector<std::thread> clients;
  std::vector<int> mismatches(kSessions, -1);
  for (int s = 0; s < kSessions; ++s) {
    clients.emplace_back([&, s] {
      const std::vector<int32_t> prompt = Repetitive(50 + s, 100 + s);
      NgramDraftSession reference(NgramOptions{});
      reference.Append(TokenContext(prompt)).IgnoreError();
      grpc::ClientContext ctx;
      std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
      stream->Write(Open(prompt, v1::SPECULATION_MODE_NGRAM, 16, 8));
      v1::DraftResponse opened;
      if (!stream->Read(&opened) || !opened.has_opened()) return;
      int bad = 0;
      std::mt19937 rng(s);
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<int32_t> tokens = {static_cast<int32_t>(rng() % kVocab)};
        stream->Write(Commit(step, tokens));
        v1::DraftResponse response;
        if (!stream->Read(&response)) return;
        reference.Append(TokenContext(tokens)).IgnoreError();
        DraftedTree want = *reference.Draft(SpecLimits{16, 8});
        if (response.tree().step() != step ||
            std::vector<int32_t>(response.tree().tokens().begin(),
                                 response.tree().tokens().end()) != want.tokens) {
          ++bad;
        }
      }
      stream->WritesDone();
      if (stream->Finish().ok()) mismatches[s] = bad;
    });
  }
  for (std::thread& t : clients) t.join();
  for (int s = 0; s < kSessions; ++s) EXPECT_EQ(mismatches[s], 0) << "session " << s;
  EXPECT_TRUE(WaitForNoSessions());
  EXPECT_EQ(service_->total_sessions(), kSessions);
}

TEST_F(DrafterServiceTest, CancellationEndsTheSession) {
  Start(true);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
  ASSERT_TRUE(stream->Write(Open(Repetitive(100, 3), v1::SPECULATION_MODE_DRAFT_MODEL)));
  ASSERT_TRUE(stream->Write(Commit(0, {1})));
  v1::DraftResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(stream->Write(Commit(1, {2})));
  ctx.TryCancel();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForNoSessions());
}

TEST_F(DrafterServiceTest, DraftModelRoundTrip) {
  Start(true, DrafterKind::kDraftModel);
  const std::vector<int32_t> prompt = Repetitive(20, 4);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
  ASSERT_TRUE(stream->Write(Open(prompt, v1::SPECULATION_MODE_AUTO, 10, 4)));
  EXPECT_EQ(FromProto(ReadOpened(stream.get()).limits()), (SpecLimits{10, 4, 0}));
  // A commit's tree_budget lowers the session's for its tree (0: none; above: clamped).
  const int commit_budgets[] = {0, 3, 0, 50};
  const size_t want_nodes[] = {10, 3, 10, 10};
  for (int step = 0; step < 4; ++step) {
    v1::DraftRequest commit = Commit(step, {static_cast<int32_t>(step * 7 % kVocab), 5});
    commit.mutable_commit()->set_tree_budget(commit_budgets[step]);
    ASSERT_TRUE(stream->Write(commit));
    v1::DraftResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.tree().step(), step);
    DraftedTree tree;
    tree.tokens.assign(response.tree().tokens().begin(), response.tree().tokens().end());
    tree.parents.assign(response.tree().parents().begin(), response.tree().parents().end());
    tree.logprobs.assign(response.tree().logprobs().begin(), response.tree().logprobs().end());
    EXPECT_EQ(tree.tokens.size(), want_nodes[step]) << "step " << step;
    EXPECT_TRUE(ValidateDraftedTree(tree, kVocab, 10, 4).ok());
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(WaitForNoSessions());
  // The session left its context (20 + 4 x 2 tokens: one full page of 16) in the draft model's
  // prefix cache; a session whose prompt continues it reuses that page.
  std::vector<int32_t> turn = prompt;
  for (int step = 0; step < 4; ++step) {
    turn.insert(turn.end(), {static_cast<int32_t>(step * 7 % kVocab), 5});
  }
  turn.push_back(9);
  grpc::ClientContext next_ctx;
  std::unique_ptr<Stream> next = stub_->Draft(&next_ctx);
  ASSERT_TRUE(next->Write(Open(turn, v1::SPECULATION_MODE_DRAFT_MODEL, 10, 4)));
  ReadOpened(next.get());
  ASSERT_TRUE(next->Write(Commit(0, {3})));
  v1::DraftResponse response;
  ASSERT_TRUE(next->Read(&response));
  ASSERT_TRUE(next->WritesDone());
  EXPECT_TRUE(next->Finish().ok());
  const std::string text = metrics_.Scrape();
  EXPECT_THAT(
      text,
      HasSubstr("treespec_drafter_prefix_cache_queried_tokens_total{kind=\"draft_model\"} 49\n"));
  EXPECT_THAT(
      text, HasSubstr("treespec_drafter_prefix_cache_hit_tokens_total{kind=\"draft_model\"} 16\n"));
}

// The value of the (unlabelled) counter or gauge `name` in the drafter's metrics; -1 if absent.
double MetricValue(const DrafterMetrics& metrics, const std::string& name) {
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    if (family.name != name || family.metric.empty()) continue;
    return family.type == prometheus::MetricType::Gauge ? family.metric[0].gauge.value
                                                        : family.metric[0].counter.value;
  }
  return -1;
}

// A verifier that died or hung without closing its streams (here: a client that opens a
// session and then goes silent, neither cancelling nor half-closing) loses the session after
// the idle timeout, with a status that says so; one that keeps committing keeps its session.
TEST_F(DrafterServiceTest, SilentVerifierSessionIsReapedAfterTheIdleTimeout) {
  Start(false, DrafterKind::kNgram, absl::Seconds(1));
  const std::vector<int32_t> prompt = Repetitive(30, 3);
  v1::DraftResponse response;
  grpc::ClientContext silent_ctx;
  std::unique_ptr<Stream> silent = stub_->Draft(&silent_ctx);
  ASSERT_TRUE(silent->Write(Open(prompt)));
  ReadOpened(silent.get());
  ASSERT_TRUE(silent->Write(Commit(0, {prompt[2]})));
  ASSERT_TRUE(silent->Read(&response));

  grpc::ClientContext busy_ctx;
  std::unique_ptr<Stream> busy = stub_->Draft(&busy_ctx);
  ASSERT_TRUE(busy->Write(Open(prompt)));
  ReadOpened(busy.get());
  ASSERT_TRUE(busy->Write(Commit(0, {prompt[0]})));
  ASSERT_TRUE(busy->Read(&response));  // both sessions are open on the server now
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; service_->active_sessions() == 2 &&
                     std::chrono::steady_clock::now() - start < std::chrono::seconds(30);
       ++step) {
    ASSERT_TRUE(busy->Write(Commit(step, {prompt[step % 7]})));
    ASSERT_TRUE(busy->Read(&response));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // well inside the timeout
  }
  EXPECT_EQ(service_->active_sessions(), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  EXPECT_EQ(MetricValue(metrics_, "treespec_drafter_sessions_reaped_total"), 1);
  EXPECT_EQ(MetricValue(metrics_, "treespec_drafter_sessions_active"), 1);
  if (service_->active_sessions() != 1) silent_ctx.TryCancel();  // not reaped: don't hang
  EXPECT_FALSE(silent->Read(&response));
  const grpc::Status status = silent->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("--session_idle_timeout_s"));

  ASSERT_TRUE(busy->WritesDone());
  EXPECT_TRUE(busy->Finish().ok());
  EXPECT_TRUE(WaitForNoSessions());
  EXPECT_EQ(MetricValue(metrics_, "treespec_drafter_sessions_active"), 0);
}

}  // namespace
}  // namespace treespec

namespace treespec {
namespace {

// Target features reach a session that takes them, row for row, cut to the layers it reads;
// a session refuses features that are the wrong width, too few or too many for its context, or
// sent to a kind that reads tokens only, and an open whose feature layers lack its own, naming
// the field.
TEST_F(DrafterServiceTest, FeaturesReachTheSessionThatTakesThemAndBadOnesAreRefused) {
  Start(false, DrafterKind::kNgram, absl::Seconds(60), std::make_unique<FeatureCountingFactory>());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  auto open_with = [&](v1::SpeculationMode mode, const std::vector<int>& layers) {
    v1::DraftRequest open = Open(prompt, mode);
    open.mutable_open()->mutable_feature_layers()->Assign(layers.begin(), layers.end());
    return open;
  };
  {  // GetInfo states what the feature kind needs.
    grpc::ClientContext ctx;
    v1::DrafterInfo info;
    ASSERT_TRUE(stub_->GetInfo(&ctx, v1::DrafterInfoRequest(), &info).ok());
    ASSERT_EQ(info.feature_needs_size(), 1);
    EXPECT_EQ(info.feature_needs(0).mode(), v1::SPECULATION_MODE_DFLASH);
    EXPECT_EQ(FromProto(info.feature_needs(0)), (FeatureSpec{{0, 1}, 2, 4, kVocab}));
  }
  // The verifier sends layers 0, 1 and 3 (6 values a row); the session keeps 0 and 1, so the
  // newest row's last value is its column 3 (r + 1 + 3/4), not column 5.
  const v1::DraftRequest open = open_with(v1::SPECULATION_MODE_DFLASH, {0, 1, 3});
  {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
    ASSERT_TRUE(stream->Write(open));
    ReadOpened(stream.get());
    // Commit 0: the first bonus, with the prompt's 5 rows; then 3 tokens with 3 rows.
    ASSERT_TRUE(stream->Write(WithFeatures(Commit(0, {9}), 5, 6)));
    v1::DraftResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_THAT(response.tree().tokens(), ElementsAre(5));
    EXPECT_THAT(response.tree().logprobs(), ElementsAre(5.75f));
    ASSERT_TRUE(stream->Write(WithFeatures(Commit(1, {10, 11, 12}), 3, 6)));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_THAT(response.tree().tokens(), ElementsAre(8));
    EXPECT_THAT(response.tree().logprobs(), ElementsAre(3.75f));
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
  {  // The prompt's rows in parts of 2 rows (24 bytes), then the tokens with the last row.
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
    ASSERT_TRUE(stream->Write(open));
    ReadOpened(stream.get());
    absl::StatusOr<DraftContext> whole =
        DraftContextFromProto(WithFeatures(Commit(0, {9}), 5, 6).commit(), "commit");
    ASSERT_TRUE(whole.ok()) << whole.status();
    const std::vector<v1::DraftRequest> parts = CommitParts(0, *whole, 24);
    ASSERT_EQ(parts.size(), 3u);
    for (const v1::DraftRequest& part : parts) ASSERT_TRUE(stream->Write(part));
    v1::DraftResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_THAT(response.tree().tokens(), ElementsAre(5));
    EXPECT_THAT(response.tree().logprobs(), ElementsAre(5.75f));
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
  // Parts that carry tokens, change step before their commit ends, or hold more rows than the
  // context has tokens.
  auto expect_parts_refused = [&](std::vector<v1::DraftRequest> messages, const std::string& says) {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = stub_->Draft(&ctx);
    ASSERT_TRUE(stream->Write(open));
    for (const v1::DraftRequest& m : messages) stream->Write(m);
    v1::DraftResponse response;
    while (stream->Read(&response)) EXPECT_EQ(response.kind_case(), v1::DraftResponse::kOpened);
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << says;
    EXPECT_THAT(status.error_message(), HasSubstr(says));
  };
  v1::DraftRequest part = WithFeatures(Commit(0, {}), 2, 6);
  part.mutable_commit()->set_more(true);
  v1::DraftRequest with_tokens = WithFeatures(Commit(0, {9}), 2, 6);
  with_tokens.mutable_commit()->set_more(true);
  expect_parts_refused({with_tokens},
                       "commit step 0 (a part with `more`) carries 1 tokens; a part with `more` "
                       "carries feature rows only");
  expect_parts_refused({part, WithFeatures(Commit(1, {9}), 3, 6)},
                       "commit step 1 follows parts of commit step 0");
  expect_parts_refused({part, part, part},
                       "6 feature rows before the commit's tokens, for a context of 5 tokens");
  expect_parts_refused({part, WithFeatures(Commit(0, {9}), 2, 6)},
                       "the session has 4 feature rows for 6 context tokens");

  v1::DraftRequest bad = WithFeatures(Commit(0, {9}), 5, 4);
  grpc::Status status = ExpectFailure(open, &bad);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("commit step 0: features rows are 4 values wide; open.feature_layers "
                        "[0, 1, 3] x hidden 2 = 6"));
  bad = WithFeatures(Commit(0, {9}), 4, 6);
  status = ExpectFailure(open, &bad);
  EXPECT_THAT(status.error_message(),
              HasSubstr("commit step 0: features: the session has 4 feature rows for 6 context "
                        "tokens"));
  bad = Commit(0, {9});
  status = ExpectFailure(open, &bad);
  EXPECT_THAT(status.error_message(), HasSubstr("0 feature rows for 6 context tokens"));
  bad = WithFeatures(Commit(0, {9}), 5, 6);
  bad.mutable_commit()->mutable_features()->at(3) = static_cast<char>(0x7f);  // row 0 col 1: NaN
  bad.mutable_commit()->mutable_features()->at(2) = static_cast<char>(0xc0);
  status = ExpectFailure(open, &bad);
  EXPECT_THAT(status.error_message(),
              HasSubstr("commit step 0: features: row 0 column 1 is not finite (NaN)"));
  bad = WithFeatures(Commit(0, {9}), 5, 6);
  bad.mutable_commit()->set_feature_rows(4);  // 60 bytes are not 4 rows of bf16
  status = ExpectFailure(open, &bad);
  EXPECT_THAT(status.error_message(), HasSubstr("features has 60 bytes for feature_rows 4"));
  // Feature layers that lack the drafter's own, or are not the target's layers in order.
  status = ExpectFailure(open_with(v1::SPECULATION_MODE_DFLASH, {1, 3}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("open.feature_layers [1, 3] lack layers this DFLASH drafter reads: it "
                        "needs layers [0, 1] x hidden 2"));
  status = ExpectFailure(open_with(v1::SPECULATION_MODE_DFLASH, {}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  status = ExpectFailure(open_with(v1::SPECULATION_MODE_DFLASH, {0, 1, 4}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("open.feature_layers [0, 1, 4] must be strictly ascending within [0, 4)"));
  // An n-gram session reads tokens only: no feature layers at open, no features in commits.
  status = ExpectFailure(open_with(v1::SPECULATION_MODE_NGRAM, {0}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("open.feature_layers is [0] but a NGRAM session reads tokens only"));
  const v1::DraftRequest ngram = Open(prompt, v1::SPECULATION_MODE_NGRAM);
  bad = WithFeatures(Commit(0, {9}), 5, 4);
  status = ExpectFailure(ngram, &bad);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("commit step 0: features: a NGRAM session reads tokens only"));
}

}  // namespace
}  // namespace treespec
