// treespec-verifier: loads the target model, connects to the drafter pool, serves Generation.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/backend/load_model.h"
#include "common/metrics/metrics_http_server.h"
#include "common/model/causal_lm.h"
#include "common/rpc/bearer_auth.h"
#include "common/rpc/connection_age.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/rpc/keepalive.h"
#include "common/rpc/tls.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/log.h"
#include "common/util/malloc_tuning.h"
#include "common/util/shutdown_signal.h"
#include "common/util/status_macros.h"
#include "verifier_service/drafter_client.h"
#include "verifier_service/engine.h"
#include "verifier_service/generation_service.h"
#include "verifier_service/serving_metrics.h"
#include "verifier_service/step_cost_profiler.h"

ABSL_FLAG(std::string, model, "models/tiny-target", "target model directory (HF format)");
ABSL_FLAG(bool, random_weights, false,
          "benchmarks only: read only config.json from --model and make pseudo-random weights "
          "on the GPU (a real model's shape without its checkpoint; mode REPLAY gives it a set "
          "acceptance)");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json path; empty = the model's own (its tokenizer.json, or Kimi-K2's "
          "tiktoken.model) if present; none = ids only");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 50051, "port to listen on; 0 picks a free one (printed at start)");
ABSL_FLAG(std::string, drafter, "", "gRPC target of the drafter pool; empty = no speculation");
ABSL_FLAG(std::string, device, "auto",
          "model backend: auto (CUDA when --tp GPUs are present), cpu, cuda, cuda:N (--tp GPUs "
          "from N) or cuda:N,M,... (one GPU per rank)");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks (one GPU each over NCCL; threads on the CPU)");
ABSL_FLAG(int, max_batch, 16, "requests verified together per step");
ABSL_FLAG(int, max_queue, 1024, "waiting requests beyond this get RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, prefix_cache, "on",
          "on: finished requests leave their full KV pages cached and a new request reuses "
          "its longest cached prompt prefix (one whose drafter takes target features: as far "
          "as its drafter holds that prefix's feature rows); off: every prompt is prefilled "
          "whole");
ABSL_FLAG(int, prefill_chunk, 2048,
          "chunked prefill: prompts are computed in chunks ending at multiples of this many "
          "tokens, and a step takes at most this many prompt tokens beside the running "
          "requests' verify trees, so running streams never wait for a whole long prefill; "
          "0 = each prompt whole in one step");
ABSL_FLAG(int, kv_pages, 0, "KV-cache pages; 0 = max_batch full contexts");
ABSL_FLAG(int, kv_page_size, 16, "tokens per KV-cache page");
ABSL_FLAG(int, context_length, 0, "served context; 0 = the model's max_position_embeddings");
ABSL_FLAG(int, tree_budget, 16,
          "drafted nodes per step for requests that set none (lowered to what the drafters "
          "serve; the largest a request may ask for is the drafters' --max_tree_budget)");
ABSL_FLAG(int, max_depth, 8, "deepest drafted node for requests that set none");
ABSL_FLAG(int, max_new_tokens, 256, "default max_new_tokens");
ABSL_FLAG(int, max_new_tokens_limit, 0,
          "largest max_new_tokens a request may ask for (more is INVALID_ARGUMENT; reported by "
          "GetModelInfo); 0 = only the context length bounds it");
ABSL_FLAG(double, step_cost_profile_s, 0,
          "at start, time verify steps over a grid of batch size x drafted nodes x context for "
          "up to this many seconds: the step-cost model (docs/architecture.md), scored in "
          "/metrics and refreshed by every step; 0 = no step-cost model");
ABSL_FLAG(std::string, step_cost_cache, "",
          "file that keeps the step-cost model between starts: read when it was measured for "
          "this model, device, TP and limits, else profiled and written there");
ABSL_FLAG(int, draft_timeout_ms, 50, "per-step wait for a draft before verifying without one");
ABSL_FLAG(int, drain_seconds, 30,
          "on SIGTERM/SIGINT: health goes NOT_SERVING, new requests get UNAVAILABLE, and the "
          "running ones get this long to finish before they are cancelled (keep the pod's "
          "termination grace period above it)");
ABSL_FLAG(int, metrics_port, 0,
          "HTTP port of the Prometheus /metrics endpoint on --host; 0 picks a free one (printed "
          "as 'metrics on HOST:PORT'), -1 turns it off");
ABSL_FLAG(int, max_message_bytes, 4 << 20,
          "largest message accepted, in bytes: a bigger request gets RESOURCE_EXHAUSTED (and is "
          "reported by GetModelInfo); a bigger drafter response ends that draft session, which "
          "is reopened");
ABSL_FLAG(int, keepalive_s, 30,
          "ping a client connection quiet for this long and drop it (cancelling its requests, "
          "which frees their KV pages) when no answer comes within 10 s; the same for drafter "
          "connections (their sessions are reopened; the drafters need a --keepalive_s of at "
          "most twice this, not 0, to accept the pings); 0 = off");
ABSL_FLAG(int, max_connection_age_s, 300,
          "close client connections after this long (clients re-resolve and spread over new "
          "replicas); 0: never");

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: clients must present a certificate it signed (mutual TLS; needs --tls_cert)");
ABSL_FLAG(std::string, drafter_tls_ca, "",
          "PEM CA that signed the drafters' certificates: reach them over TLS");
ABSL_FLAG(std::string, drafter_tls_cert, "",
          "PEM client certificate for drafters that require one (with --drafter_tls_key)");
ABSL_FLAG(std::string, drafter_tls_key, "", "PEM private key of --drafter_tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of accepted bearer tokens, one a line: Generation calls without "
          "'authorization: Bearer <one of them>' get UNAUTHENTICATED (health and reflection stay "
          "open); empty = no authentication");

namespace {

// The step-cost model of `model` under `opts`: from --step_cost_cache if it was measured for
// the same model, device, TP and limits, else profiled (and cached).
absl::StatusOr<treespec::StepCostModel> StepCost(treespec::CausalLm& model,
                                                 const treespec::EngineOptions& opts) {
  treespec::StepCostProfileOptions profile;
  profile.max_batch = opts.max_batch;
  profile.max_tree_nodes = opts.spec.max.tree_budget;
  profile.max_seconds = absl::GetFlag(FLAGS_step_cost_profile_s);
  const treespec::ModelConfig& c = model.config();
  const int context = opts.context_length > 0 ? opts.context_length : c.max_position_embeddings;
  profile.max_context = std::min(profile.max_context, context);
  const std::string key = absl::StrCat(
      std::filesystem::absolute(absl::GetFlag(FLAGS_model)).lexically_normal().string(), " ",
      c.architecture, " layers ", c.num_layers, " hidden ", c.hidden_size, " vocab ", c.vocab_size,
      " on ", model.device(), " tp ", model.tensor_parallel(), " batch ", profile.max_batch,
      " tree ", profile.max_tree_nodes, " context ", profile.max_context, " kv pages ",
      model.kv_cache().num_pages(), " x ", model.kv_cache().page_size());
  const absl::Time start = absl::Now();
  bool profiled = false;
  absl::StatusOr<treespec::StepCostModel> cost = treespec::LoadOrProfileStepCost(
      model, profile, absl::GetFlag(FLAGS_step_cost_cache), key, &profiled);
  if (!cost.ok()) {
    return absl::Status(cost.status().code(),
                        absl::StrCat("step-cost model: ", cost.status().message()));
  }
  TS_LOG(kInfo, "step-cost model %s in %.1f s; %s",
         profiled ? "measured" : "read from --step_cost_cache",
         absl::ToDoubleSeconds(absl::Now() - start), cost->Describe());
  return cost;
}

// Loads what the service needs (model, tokenizer, drafter link, engine); an error names what
// failed.
struct Loaded {
  std::unique_ptr<treespec::CausalLm> model;
  std::unique_ptr<treespec::Tokenizer> tokenizer;
  std::unique_ptr<treespec::GrpcDraftSource> drafts;
  std::unique_ptr<treespec::Engine> engine;
};

absl::StatusOr<Loaded> Load(const treespec::EngineOptions& opts) {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  treespec::LmOptions lm;
  lm.tensor_parallel = absl::GetFlag(FLAGS_tp);
  lm.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  lm.kv_page_size = absl::GetFlag(FLAGS_kv_page_size);
  lm.max_batch = absl::GetFlag(FLAGS_max_batch);
  Loaded l;
  auto model = absl::GetFlag(FLAGS_random_weights)
                   ? treespec::CreateRandomCausalLm(model_dir, absl::GetFlag(FLAGS_device), lm, 1)
                   : treespec::LoadCausalLm(model_dir, absl::GetFlag(FLAGS_device), lm);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("cannot load model: ", model.status().ToString()));
  }
  l.model = *std::move(model);
  const std::string tok_path = absl::GetFlag(FLAGS_tokenizer);
  if (tok_path != "none") {
    auto loaded = tok_path.empty() ? treespec::LoadModelTokenizer(model_dir)
                                   : treespec::LoadTokenizer(tok_path);
    if (loaded.ok()) {
      l.tokenizer = *std::move(loaded);
    } else if (!tok_path.empty() || !absl::IsNotFound(loaded.status())) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("cannot load tokenizer: ", loaded.status().ToString(),
                                       " (--tokenizer=none serves token ids only)"));
    }
  }
  if (l.tokenizer == nullptr) TS_LOG(kWarning, "no tokenizer: serving token ids only");
  if (!absl::GetFlag(FLAGS_drafter).empty()) {
    auto credentials =
        treespec::MakeChannelCredentials({.cert = absl::GetFlag(FLAGS_drafter_tls_cert),
                                          .key = absl::GetFlag(FLAGS_drafter_tls_key),
                                          .ca = absl::GetFlag(FLAGS_drafter_tls_ca),
                                          .cert_flag = "--drafter_tls_cert",
                                          .key_flag = "--drafter_tls_key",
                                          .ca_flag = "--drafter_tls_ca"});
    if (!credentials.ok()) return credentials.status();
    treespec::DrafterLinkOptions link;
    link.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
    link.keepalive_s = absl::GetFlag(FLAGS_keepalive_s);
    l.drafts = std::make_unique<treespec::GrpcDraftSource>(absl::GetFlag(FLAGS_drafter),
                                                           *std::move(credentials), link);
  }
  treespec::EngineOptions engine_options = opts;
  if (absl::GetFlag(FLAGS_step_cost_profile_s) > 0) {
    ASSIGN_OR_RETURN(engine_options.step_cost, StepCost(*l.model, opts));
  }
  l.engine = std::make_unique<treespec::Engine>(l.model.get(), l.tokenizer.get(), l.drafts.get(),
                                                std::move(engine_options));
  return l;
}

// Every gRPC object lives in here: main waits for gRPC's shutdown after it returns.
int Main(int argc, char** argv) {
  treespec::BlockShutdownSignals();
  treespec::KeepLargeBuffersInHeap();
  absl::SetProgramUsageMessage(
      "Serves treespec.v1.Generation: the target model, verifying drafted trees.");
  absl::ParseCommandLine(argc, argv);
  using treespec::LogLevel;
  treespec::EngineOptions opts;
  opts.max_batch = absl::GetFlag(FLAGS_max_batch);
  opts.max_queue = absl::GetFlag(FLAGS_max_queue);
  opts.context_length = absl::GetFlag(FLAGS_context_length);
  opts.spec.defaults.tree_budget = absl::GetFlag(FLAGS_tree_budget);
  opts.spec.defaults.max_depth = absl::GetFlag(FLAGS_max_depth);
  opts.default_max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  opts.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens_limit);
  opts.draft_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_draft_timeout_ms));
  const std::string prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  if (prefix_cache != "on" && prefix_cache != "off") {
    TS_LOG(kError, "--prefix_cache=%s: want on or off", prefix_cache);
    return 2;
  }
  opts.prefix_cache = prefix_cache == "on";
  opts.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (absl::Status valid = treespec::ValidateEngineOptions(opts); !valid.ok()) {
    TS_LOG(kError, "%s", std::string(valid.message()));
    return 2;
  }
  for (const auto& [name, value] :
       {std::pair{"--drain_seconds", absl::GetFlag(FLAGS_drain_seconds)},
        std::pair{"--max_connection_age_s", absl::GetFlag(FLAGS_max_connection_age_s)},
        std::pair{"--keepalive_s", absl::GetFlag(FLAGS_keepalive_s)}}) {
    if (value < 0) {
      TS_LOG(kError, "%s=%d: must be >= 0", name, value);
      return 2;
    }
  }
  const int max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message_bytes < 1) {
    TS_LOG(kError, "--max_message_bytes=%d: must be >= 1", max_message_bytes);
    return 2;
  }

  // Listen first, NOT_SERVING (and Generate answering UNAVAILABLE) while the model loads, so
  // startup probes see the loading; the "listening on" line is printed once it serves.
  treespec::GenerationService service;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = treespec::MakeServerCredentials({.cert = absl::GetFlag(FLAGS_tls_cert),
                                                      .key = absl::GetFlag(FLAGS_tls_key),
                                                      .ca = absl::GetFlag(FLAGS_tls_client_ca),
                                                      .ca_flag = "--tls_client_ca"});
  if (!credentials.ok()) {
    TS_LOG(kError, "%s", std::string(credentials.status().message()));
    return 2;
  }
  absl::StatusOr<treespec::BearerTokens> tokens =
      treespec::BearerTokens::Load(absl::GetFlag(FLAGS_auth_token_file), "--auth_token_file");
  if (!tokens.ok()) {
    TS_LOG(kError, "%s", std::string(tokens.status().message()));
    return 2;
  }
  if (tokens->enabled() && absl::GetFlag(FLAGS_tls_cert).empty()) {
    TS_LOG(kWarning, "--auth_token_file without --tls_cert: tokens cross the network in the clear");
  }
  service.RequireBearerTokens(*std::move(tokens));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_port)), *credentials,
      &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  treespec::SetServerKeepalive(builder, absl::GetFlag(FLAGS_keepalive_s));
  // A connection past its age may finish its calls for as long as a drain would.
  treespec::SetMaxConnectionAge(builder, absl::GetFlag(FLAGS_max_connection_age_s),
                                absl::GetFlag(FLAGS_drain_seconds));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    TS_LOG(kError, "cannot listen on %s:%d", absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port));
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(false);

  absl::StatusOr<Loaded> loaded = Load(opts);
  if (!loaded.ok()) {
    TS_LOG(kError, "%s", std::string(loaded.status().message()));
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  treespec::CausalLm& model = *loaded->model;
  treespec::Engine& engine = *loaded->engine;
  treespec::ServiceInfo info;
  info.model_name = std::filesystem::path(absl::GetFlag(FLAGS_model)).filename().string();
  info.device = model.device();
  info.tensor_parallel = model.tensor_parallel();
  info.drafter_target = absl::GetFlag(FLAGS_drafter);
  info.max_message_bytes = max_message_bytes;
  treespec::ServingMetrics metrics([&engine] { return engine.Snapshot(); });
  std::unique_ptr<treespec::MetricsHttpServer> metrics_server;
  if (const int metrics_port = absl::GetFlag(FLAGS_metrics_port); metrics_port >= 0) {
    auto started =
        treespec::MetricsHttpServer::Start(absl::GetFlag(FLAGS_host), metrics_port, &metrics);
    if (!started.ok()) {
      TS_LOG(kError, "--metrics_port: %s", started.status().ToString());
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
    metrics_server = *std::move(started);
    std::printf("treespec-verifier metrics on %s:%d\n", absl::GetFlag(FLAGS_host).c_str(),
                metrics_server->port());
  }
  if (loaded->drafts != nullptr) loaded->drafts->SetMetrics(&metrics);
  service.Activate(&engine, &model, loaded->tokenizer.get(), info, &metrics);
  server->GetHealthCheckService()->SetServingStatus(true);
  std::printf("treespec-verifier listening on %s:%d\n", absl::GetFlag(FLAGS_host).c_str(), port);
  std::fflush(stdout);
  TS_LOG(kInfo, "model %s: %d layers, vocab %d, context %d, tp %d, drafter '%s'",
         absl::GetFlag(FLAGS_model), model.config().num_layers, model.config().vocab_size,
         engine.context_length(), model.tensor_parallel(), absl::GetFlag(FLAGS_drafter));

  treespec::WaitForShutdownSignal();
  // Drain: out of the load balancer's rotation, no new work, the running requests finish.
  server->GetHealthCheckService()->SetServingStatus(false);
  engine.Drain();
  const treespec::EngineSnapshot at_signal = engine.Snapshot();
  TS_LOG(kInfo, "draining: %d running, %d queued, up to %d s", at_signal.running, at_signal.queued,
         absl::GetFlag(FLAGS_drain_seconds));
  const bool idle = engine.WaitIdle(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  if (idle) {
    TS_LOG(kInfo, "shutting down: drained");
  } else {
    TS_LOG(kWarning, "shutting down: the drain deadline passed, cancelling the rest");
  }
  engine.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return treespec::AfterGrpcShutdown(Main(argc, argv)); }
