// treespec-drafter-bench: drafting latency per step, in process and over gRPC on loopback.
//
//   treespec-drafter-bench [--draft_model=DIR] [--device=cpu] [--context=512] [--steps=50]
//                          [--sessions=16] [--json=out.json]
//
// Per step = one AppendAndDraft of the emitted tokens, as the service does for a Commit;
// the emitted tokens come from walking the previous tree along a synthetic repetitive text.
// Without --draft_model a random model of the embedded draft's shape (2 layers x 128, vocab
// 4096) is written to a temporary directory; --init_std sets how peaked it is.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/load_model.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/model/forwarding_causal_lm.h"
#include "common/model/random_model.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/util/status_macros.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "treespec/v1/drafter.grpc.pb.h"

ABSL_FLAG(std::string, draft_model, "", "draft model dir; empty = random 2x128, vocab 4096");
ABSL_FLAG(std::string, device, "cpu", "draft model backend: cpu, cuda, cuda:N or auto");
ABSL_FLAG(double, init_std, 0.25, "weight std of the random model (larger = more peaked)");
ABSL_FLAG(int, context, 512, "prompt tokens before the first step");
ABSL_FLAG(int, steps, 50, "measured steps per configuration");
ABSL_FLAG(int, tree_budget, 16, "drafted nodes per tree");
ABSL_FLAG(int, max_depth, 8, "deepest drafted node");
ABSL_FLAG(int, sessions, 16, "sessions drafting at once in the concurrent rows (0: none)");
ABSL_FLAG(std::string, json, "", "also write the results here as JSON");

namespace treespec {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string name;
  double ms_per_step = 0;
  double nodes_per_tree = 0;
  double tokens_per_step = 0;  // emitted per step (accepted + bonus) against the target text
  // In process with a draft model: time inside the model's Forward per step, its calls and
  // rows per step (the rest of ms_per_step is the drafter's own host work). The model's time
  // includes ranking its rows' top-k: on its device, or on the host for "host top-k" rows.
  double forward_ms_per_step = 0, forwards_per_step = 0, rows_per_step = 0;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A CausalLm that passes every call on and times Forward and ForwardTopK (the draft model's
// share of a step). host_top_k ranks on the host from the full logits (CausalLm's default
// ForwardTopK) instead of on the device, for an A/B of the two in one run.
class TimedLm final : public ForwardingCausalLm {
 public:
  TimedLm(std::unique_ptr<CausalLm> lm, bool host_top_k)
      : ForwardingCausalLm(std::move(lm)), host_top_k_(host_top_k) {}
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) override {
    const auto t0 = Clock::now();
    auto logits = ForwardingCausalLm::Forward(batch);
    time_ += Clock::now() - t0;
    ++calls_;
    for (const SeqTree& s : batch) rows_ += static_cast<int64_t>(s.tokens.size()) - s.first_new;
    return logits;
  }
  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ForwardTopK(
      absl::Span<const SeqTree> batch, int k, TopKRows rows) override {
    const auto t0 = Clock::now();
    if (host_top_k_) {
      const Clock::duration forward_before = time_;
      auto top = CausalLm::ForwardTopK(batch, k, rows);  // calls Forward above (counted there)
      time_ = forward_before + (Clock::now() - t0);
      return top;
    }
    auto top = ForwardingCausalLm::ForwardTopK(batch, k, rows);
    time_ += Clock::now() - t0;
    ++calls_;
    for (const SeqTree& s : batch) rows_ += static_cast<int64_t>(s.tokens.size()) - s.first_new;
    return top;
  }
  // Forward time, calls and rows since the last call.
  void Take(Clock::duration* time, int64_t* calls, int64_t* rows) {
    *time = std::exchange(time_, Clock::duration{});
    *calls = std::exchange(calls_, 0);
    *rows = std::exchange(rows_, 0);
  }

 private:
  const bool host_top_k_;
  Clock::duration time_{};
  int64_t calls_ = 0, rows_ = 0;
};

// The "target's text": a phrase of 12 tokens repeated, every fifth repetition with one token
// changed, so ngram matches exist but are not always right. The prompt is its first tokens and
// the simulated verifier accepts drafted tokens while they agree with it.
class TargetText {
 public:
  TargetText(int vocab, uint32_t seed) : vocab_(vocab), seed_(seed), phrase_(12) {
    std::mt19937 rng(seed);
    for (int32_t& t : phrase_) t = static_cast<int32_t>(rng() % vocab);
  }
  int32_t At(int64_t i) const {
    if ((i / 12) % 5 == 4 && i % 12 == 3) {
      return static_cast<int32_t>((static_cast<uint64_t>(i) * 2654435761u + seed_) % vocab_);
    }
    return phrase_[i % phrase_.size()];
  }
  std::vector<int32_t> Range(int64_t begin, int64_t end) const {
    std::vector<int32_t> out;
    for (int64_t i = begin; i < end; ++i) out.push_back(At(i));
    return out;
  }

 private:
  const int vocab_;
  const uint32_t seed_;
  std::vector<int32_t> phrase_;
};

// Walks the drafted tree along the target's text from position `pos` (the bonus is at pos-1):
// returns the accepted drafted tokens plus the next bonus, as the verifier would emit them.
std::vector<int32_t> Emit(const TargetText& text, int64_t pos, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& parents) {
  int32_t cur = -1;
  int64_t p = pos;
  for (size_t j = 0; j < tokens.size(); ++j) {
    if (parents[j] == cur && tokens[j] == text.At(p)) {
      cur = static_cast<int32_t>(j);
      ++p;
    }
  }
  return text.Range(pos, p + 1);
}

// `timed`, when given, is the model inside `factory`: its Forward time is reported too.
absl::StatusOr<Result> InProcess(const std::string& name, DrafterFactory& factory, int vocab,
                                 TimedLm* timed = nullptr) {
  const TargetText text(vocab, 1);
  ASSIGN_OR_RETURN(std::unique_ptr<DraftSession> session, factory.NewSession());
  int64_t pos = absl::GetFlag(FLAGS_context);
  RETURN_IF_ERROR(session->Append(TokenContext(text.Range(0, pos))));
  const SpecLimits limits{absl::GetFlag(FLAGS_tree_budget), absl::GetFlag(FLAGS_max_depth)};
  const int steps = absl::GetFlag(FLAGS_steps);
  DraftedTree tree;
  int64_t nodes = 0, emitted_total = 0;
  Clock::duration total{}, forward{}, unused{};
  int64_t calls = 0, rows = 0, unused_count = 0;
  if (timed != nullptr) timed->Take(&unused, &unused_count, &unused_count);  // the prompt
  for (int s = 0; s < steps; ++s) {
    const std::vector<int32_t> emitted = Emit(text, pos, tree.tokens, tree.parents);
    pos += static_cast<int64_t>(emitted.size());
    emitted_total += static_cast<int64_t>(emitted.size());
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(tree, session->AppendAndDraft(TokenContext(emitted), limits));
    total += Clock::now() - t0;
    nodes += static_cast<int64_t>(tree.tokens.size());
  }
  if (timed != nullptr) timed->Take(&forward, &calls, &rows);
  Result r{name, Ms(total) / steps, static_cast<double>(nodes) / steps,
           static_cast<double>(emitted_total) / steps};
  r.forward_ms_per_step = Ms(forward) / steps;
  r.forwards_per_step = static_cast<double>(calls) / steps;
  r.rows_per_step = static_cast<double>(rows) / steps;
  return r;
}

// `sessions` sessions stepping at once, each on its own thread as the service's pool runs
// them: ms_per_step is the wall time of a step of every session (one round of the verifier's
// batch), so sessions / ms_per_step is trees per millisecond.
absl::StatusOr<Result> Concurrent(const std::string& name, DrafterFactory& factory, int vocab,
                                  int sessions, TimedLm* timed) {
  const TargetText text(vocab, 1);
  const int64_t context = absl::GetFlag(FLAGS_context);
  const SpecLimits limits{absl::GetFlag(FLAGS_tree_budget), absl::GetFlag(FLAGS_max_depth)};
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<std::unique_ptr<DraftSession>> open(sessions);
  for (auto& session : open) {
    ASSIGN_OR_RETURN(session, factory.NewSession());
    RETURN_IF_ERROR(session->Append(TokenContext(text.Range(0, context))));
  }
  std::vector<absl::Status> status(sessions);
  std::vector<int64_t> nodes(sessions, 0), emitted(sessions, 0);
  Clock::duration forward{}, unused{};
  int64_t calls = 0, rows = 0, unused_count = 0;
  timed->Take(&unused, &unused_count, &unused_count);  // the prompts
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      int64_t pos = context;
      DraftedTree tree;
      for (int s = 0; s < steps && status[i].ok(); ++s) {
        const std::vector<int32_t> e = Emit(text, pos, tree.tokens, tree.parents);
        pos += static_cast<int64_t>(e.size());
        emitted[i] += static_cast<int64_t>(e.size());
        absl::StatusOr<DraftedTree> next = open[i]->AppendAndDraft(TokenContext(e), limits);
        if (!next.ok()) {
          status[i] = next.status();
          break;
        }
        tree = *std::move(next);
        nodes[i] += static_cast<int64_t>(tree.tokens.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const Clock::duration total = Clock::now() - t0;
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  int64_t all_nodes = 0, all_emitted = 0;
  for (int i = 0; i < sessions; ++i) {
    all_nodes += nodes[i];
    all_emitted += emitted[i];
  }
  const double per = static_cast<double>(sessions) * steps;
  timed->Take(&forward, &calls, &rows);
  Result r{name, Ms(total) / steps, all_nodes / per, all_emitted / per};
  r.forward_ms_per_step = Ms(forward) / steps;
  r.forwards_per_step = static_cast<double>(calls) / steps;
  r.rows_per_step = static_cast<double>(rows) / steps;
  return r;
}

// Commit -> DraftTree round trips over a real gRPC stream.
absl::StatusOr<Result> OverGrpc(const std::string& name, v1::Drafter::Stub& stub,
                                v1::SpeculationMode mode, int vocab) {
  const TargetText text(vocab, 1);
  grpc::ClientContext ctx;
  auto stream = stub.Draft(&ctx);
  int64_t pos = absl::GetFlag(FLAGS_context);
  const std::vector<int32_t> prompt = text.Range(0, pos);
  v1::DraftRequest open;
  open.mutable_open()->mutable_prompt_ids()->Assign(prompt.begin(), prompt.end());
  open.mutable_open()->set_mode(mode);
  open.mutable_open()->set_tree_budget(absl::GetFlag(FLAGS_tree_budget));
  open.mutable_open()->set_max_depth(absl::GetFlag(FLAGS_max_depth));
  stream->Write(open);
  // The session's first answer states its limits (DraftOpened); trees follow, one per commit.
  v1::DraftResponse opened;
  if (!stream->Read(&opened) || !opened.has_opened()) {
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    return absl::InternalError(absl::StrCat("no DraftOpened answer: ", status.error_message()));
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<int32_t> tokens, parents;
  int64_t nodes = 0, emitted_total = 0;
  Clock::duration total{};
  for (int s = 0; s < steps; ++s) {
    const std::vector<int32_t> emitted = Emit(text, pos, tokens, parents);
    pos += static_cast<int64_t>(emitted.size());
    emitted_total += static_cast<int64_t>(emitted.size());
    v1::DraftRequest commit;
    commit.mutable_commit()->set_step(s);
    commit.mutable_commit()->mutable_tokens()->Assign(emitted.begin(), emitted.end());
    const auto t0 = Clock::now();
    v1::DraftResponse response;
    if (!stream->Write(commit) || !stream->Read(&response)) break;
    total += Clock::now() - t0;
    nodes += response.tree().tokens_size();
    tokens.assign(response.tree().tokens().begin(), response.tree().tokens().end());
    parents.assign(response.tree().parents().begin(), response.tree().parents().end());
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!status.ok()) return absl::InternalError(status.error_message());
  return Result{name, Ms(total) / steps, static_cast<double>(nodes) / steps,
                static_cast<double>(emitted_total) / steps};
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(const std::string& dir) {
  LmOptions options;
  options.max_batch = std::max(4, absl::GetFlag(FLAGS_sessions));  // KV pool: every session
  return LoadCausalLm(dir, absl::GetFlag(FLAGS_device), options);
}

absl::Status Run() {
  std::string dir = absl::GetFlag(FLAGS_draft_model);
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() / "treespec-drafter-bench-model").string();
    // The tiny draft's shape: 2 layers x 128, vocab 4096.
    ModelConfig config = testing::SmallLlamaConfig();
    config.vocab_size = 4096;
    config.max_position_embeddings = 4096;
    RandomModelOptions options;
    options.init_std = static_cast<float>(absl::GetFlag(FLAGS_init_std));
    RETURN_IF_ERROR(WriteRandomModel(config, options, dir));
  }
  std::vector<Result> results;
  auto add = [&](absl::StatusOr<Result> r) -> absl::Status {
    if (!r.ok()) return r.status();
    std::printf("%-38s %8.3f ms/step  %5.1f nodes/tree  %5.2f tokens/step", r->name.c_str(),
                r->ms_per_step, r->nodes_per_tree, r->tokens_per_step);
    if (r->forwards_per_step > 0) {
      std::printf("  (model Forward %.3f ms in %.1f calls, %.1f rows)", r->forward_ms_per_step,
                  r->forwards_per_step, r->rows_per_step);
    }
    std::printf("\n");
    std::fflush(stdout);
    results.push_back(*std::move(r));
    return absl::OkStatus();
  };

  int vocab = 0;
  {
    NgramDrafterFactory ngram(NgramOptions{});
    ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> probe, LoadModel(dir));
    vocab = probe->config().vocab_size;
    RETURN_IF_ERROR(add(InProcess("ngram", ngram, vocab)));
  }
  struct Shape {
    const char* name;
    DraftShape shape;
    int max_expand;
    bool host_top_k;
  };
  for (const Shape& shape :
       {Shape{"draft_model chain", DraftShape::kChain, 0, false},
        Shape{"draft_model tree (exact)", DraftShape::kTree, 0, false},
        Shape{"draft_model tree (expand<=4)", DraftShape::kTree, 4, false},
        Shape{"draft_model chain, host top-k", DraftShape::kChain, 0, true},
        Shape{"draft_model tree (exact), host top-k", DraftShape::kTree, 0, true}}) {
    ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> lm, LoadModel(dir));
    auto timed = std::make_unique<TimedLm>(std::move(lm), shape.host_top_k);
    TimedLm* const timer = timed.get();
    DraftModelOptions options;
    options.shape = shape.shape;
    options.max_expand_per_depth = shape.max_expand;
    DraftModelDrafterFactory factory(std::move(timed), options);
    RETURN_IF_ERROR(add(InProcess(shape.name, factory, vocab, timer)));
  }

  // Many sessions at once: their forwards share the batcher's rounds.
  if (const int sessions = absl::GetFlag(FLAGS_sessions); sessions > 0) {
    ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> lm, LoadModel(dir));
    auto timed = std::make_unique<TimedLm>(std::move(lm), false);
    TimedLm* const timer = timed.get();
    DraftModelDrafterFactory factory(std::move(timed), DraftModelOptions{});
    RETURN_IF_ERROR(
        add(Concurrent(absl::StrCat("draft_model tree (exact), ", sessions, " sessions"), factory,
                       vocab, sessions, timer)));
  }

  // The same through the service on loopback.
  ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> lm, LoadModel(dir));
  DrafterServiceOptions service_options;
  service_options.vocab_size = vocab;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(NgramOptions{}));
  drafters.Add(DrafterKind::kDraftModel,
               std::make_unique<DraftModelDrafterFactory>(std::move(lm), DraftModelOptions{}));
  DrafterService service(service_options, std::move(drafters));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError("cannot start the loopback server");
  auto stub = v1::Drafter::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  RETURN_IF_ERROR(add(OverGrpc("grpc ngram", *stub, v1::SPECULATION_MODE_NGRAM, vocab)));
  RETURN_IF_ERROR(add(
      OverGrpc("grpc draft_model tree (exact)", *stub, v1::SPECULATION_MODE_DRAFT_MODEL, vocab)));
  server->Shutdown();

  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << absl::StrFormat(
        "{\"context\": %d, \"tree_budget\": %d, \"max_depth\": %d, \"results\": [",
        absl::GetFlag(FLAGS_context), absl::GetFlag(FLAGS_tree_budget),
        absl::GetFlag(FLAGS_max_depth));
    for (size_t i = 0; i < results.size(); ++i) {
      out << absl::StrFormat(
          "%s{\"name\": \"%s\", \"ms_per_step\": %.4f, \"nodes_per_tree\": %.2f, "
          "\"tokens_per_step\": %.3f, \"forward_ms_per_step\": %.4f, "
          "\"forwards_per_step\": %.2f, \"rows_per_step\": %.2f}",
          i ? ", " : "", results[i].name, results[i].ms_per_step, results[i].nodes_per_tree,
          results[i].tokens_per_step, results[i].forward_ms_per_step, results[i].forwards_per_step,
          results[i].rows_per_step);
    }
    out << "]}\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Drafting latency per step, in process and over gRPC on loopback.");
  absl::ParseCommandLine(argc, argv);
  // Every gRPC object lives in Run: gRPC shuts down before the process exits.
  const absl::Status status = treespec::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "treespec-drafter-bench: %s\n", status.ToString().c_str());
  }
  return treespec::AfterGrpcShutdown(status.ok() ? 0 : 1);
}
