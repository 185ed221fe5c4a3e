// treespec-drafter-bench: drafting latency per step, in process and over gRPC on loopback.
//
//   treespec-drafter-bench [--draft_model=DIR] [--context=512] [--steps=50] [--json=out.json]
//
// Per step = one Append of the emitted tokens (1-3) plus one Draft, as the service does for a
// Commit. Without --draft_model a random model of the embedded draft's shape (2 layers x 128,
// vocab 4096) is written to a temporary directory; --init_std sets how peaked it is.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/causal_lm.h"
#include "common/model/random_model.h"
#include "common/util/status_macros.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "treespec/v1/drafter.grpc.pb.h"

ABSL_FLAG(std::string, draft_model, "", "draft model dir; empty = random 2x128, vocab 4096");
ABSL_FLAG(double, init_std, 0.25, "weight std of the random model (larger = more peaked)");
ABSL_FLAG(int, context, 512, "prompt tokens before the first step");
ABSL_FLAG(int, steps, 50, "measured steps per configuration");
ABSL_FLAG(int, tree_budget, 16, "drafted nodes per tree");
ABSL_FLAG(int, max_depth, 8, "deepest drafted node");
ABSL_FLAG(std::string, json, "", "also write the results here as JSON");

namespace treespec {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string name;
  double ms_per_step = 0;
  double nodes_per_tree = 0;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Text that repeats with variations, so ngram matches exist: a phrase of 12 tokens, every
// fifth repetition with one token changed.
std::vector<int32_t> Prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> phrase(12);
  for (int32_t& t : phrase) t = static_cast<int32_t>(rng() % vocab);
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = (i / 12) % 5 == 4 && i % 12 == 3 ? static_cast<int32_t>(rng() % vocab)
                                               : phrase[i % phrase.size()];
  }
  return out;
}

// The verifier's view of a step: accept the first drafted token (if any) plus a bonus.
std::vector<int32_t> Emitted(const std::vector<int32_t>& tree_tokens, int step, int vocab) {
  std::vector<int32_t> out;
  if (!tree_tokens.empty() && step % 3 != 2) out.push_back(tree_tokens[0]);
  out.push_back(static_cast<int32_t>((step * 7919) % vocab));
  return out;
}

absl::StatusOr<Result> InProcess(const std::string& name, DrafterFactory& factory, int vocab) {
  ASSIGN_OR_RETURN(std::unique_ptr<DraftSession> session, factory.NewSession());
  RETURN_IF_ERROR(session->Append(Prompt(absl::GetFlag(FLAGS_context), vocab, 1)));
  const DraftLimits limits{absl::GetFlag(FLAGS_tree_budget), absl::GetFlag(FLAGS_max_depth)};
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<int32_t> last;
  int64_t nodes = 0;
  Clock::duration total{};
  for (int s = 0; s < steps; ++s) {
    const std::vector<int32_t> emitted = Emitted(last, s, vocab);
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(session->Append(emitted));
    ASSIGN_OR_RETURN(DraftedTree tree, session->Draft(limits));
    total += Clock::now() - t0;
    nodes += static_cast<int64_t>(tree.tokens.size());
    last = tree.tokens;
  }
  return Result{name, Ms(total) / steps, static_cast<double>(nodes) / steps};
}

// Commit -> DraftTree round trips over a real gRPC stream.
absl::StatusOr<Result> OverGrpc(const std::string& name, v1::Drafter::Stub& stub,
                                v1::SpeculationMode mode, int vocab) {
  grpc::ClientContext ctx;
  auto stream = stub.Draft(&ctx);
  v1::DraftRequest open;
  const std::vector<int32_t> prompt = Prompt(absl::GetFlag(FLAGS_context), vocab, 1);
  open.mutable_open()->mutable_prompt_ids()->Assign(prompt.begin(), prompt.end());
  open.mutable_open()->set_mode(mode);
  open.mutable_open()->set_tree_budget(absl::GetFlag(FLAGS_tree_budget));
  open.mutable_open()->set_max_depth(absl::GetFlag(FLAGS_max_depth));
  stream->Write(open);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<int32_t> last;
  int64_t nodes = 0;
  Clock::duration total{};
  for (int s = 0; s < steps; ++s) {
    const std::vector<int32_t> emitted = Emitted(last, s, vocab);
    v1::DraftRequest commit;
    commit.mutable_commit()->set_step(s);
    commit.mutable_commit()->mutable_tokens()->Assign(emitted.begin(), emitted.end());
    const auto t0 = Clock::now();
    v1::DraftResponse response;
    if (!stream->Write(commit) || !stream->Read(&response)) break;
    total += Clock::now() - t0;
    nodes += response.tree().tokens_size();
    last.assign(response.tree().tokens().begin(), response.tree().tokens().end());
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!status.ok()) return absl::InternalError(status.error_message());
  return Result{name, Ms(total) / steps, static_cast<double>(nodes) / steps};
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(const std::string& dir) {
  LmOptions options;
  options.max_batch = 4;
  return LoadCpuCausalLm(dir, options);
}

absl::Status Run() {
  std::string dir = absl::GetFlag(FLAGS_draft_model);
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() / "treespec-drafter-bench-model").string();
    ModelConfig config;
    config.architecture = "LlamaForCausalLM";
    config.vocab_size = 4096;
    config.hidden_size = 128;
    config.intermediate_size = 320;
    config.num_layers = 2;
    config.num_q_heads = 8;
    config.num_kv_heads = 4;
    config.head_dim = 16;
    config.max_position_embeddings = 4096;
    config.rms_norm_eps = 1e-5f;
    config.tie_word_embeddings = true;
    RandomModelOptions options;
    options.init_std = static_cast<float>(absl::GetFlag(FLAGS_init_std));
    RETURN_IF_ERROR(WriteRandomModel(config, options, dir));
  }
  std::vector<Result> results;
  auto add = [&](absl::StatusOr<Result> r) -> absl::Status {
    if (!r.ok()) return r.status();
    std::printf("%-34s %8.3f ms/step  %5.1f nodes/tree\n", r->name.c_str(), r->ms_per_step,
                r->nodes_per_tree);
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
  };
  for (const Shape& shape : {Shape{"draft_model chain", DraftShape::kChain, 0},
                             Shape{"draft_model tree (exact)", DraftShape::kTree, 0},
                             Shape{"draft_model tree (expand<=4)", DraftShape::kTree, 4}}) {
    ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> lm, LoadModel(dir));
    DraftModelOptions options;
    options.shape = shape.shape;
    options.max_expand_per_depth = shape.max_expand;
    DraftModelDrafterFactory factory(std::move(lm), options);
    RETURN_IF_ERROR(add(InProcess(shape.name, factory, vocab)));
  }

  // The same through the service on loopback.
  ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> lm, LoadModel(dir));
  DrafterServiceOptions service_options;
  service_options.vocab_size = vocab;
  DrafterService service(service_options, std::make_unique<NgramDrafterFactory>(NgramOptions{}),
                         std::make_unique<DraftModelDrafterFactory>(std::move(lm),
                                                                    DraftModelOptions{}));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError("cannot start the loopback server");
  auto stub = v1::Drafter::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  RETURN_IF_ERROR(add(OverGrpc("grpc ngram", *stub, v1::SPECULATION_MODE_NGRAM, vocab)));
  RETURN_IF_ERROR(
      add(OverGrpc("grpc draft_model tree (exact)", *stub, v1::SPECULATION_MODE_DRAFT_MODEL, vocab)));
  server->Shutdown();

  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << absl::StrFormat("{\"context\": %d, \"tree_budget\": %d, \"max_depth\": %d, \"results\": [",
                           absl::GetFlag(FLAGS_context), absl::GetFlag(FLAGS_tree_budget),
                           absl::GetFlag(FLAGS_max_depth));
    for (size_t i = 0; i < results.size(); ++i) {
      out << absl::StrFormat("%s{\"name\": \"%s\", \"ms_per_step\": %.4f, \"nodes_per_tree\": %.2f}",
                             i ? ", " : "", results[i].name, results[i].ms_per_step,
                             results[i].nodes_per_tree);
    }
    out << "]}\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = treespec::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "treespec-drafter-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
