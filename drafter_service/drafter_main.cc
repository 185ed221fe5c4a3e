// treespec-drafter: serves treespec.v1.Drafter (ngram; with --draft_model a draft LM; with
// --dflash a DFlash block drafter conditioned on the target's features).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/backend/load_model.h"
#include "common/metrics/metrics_http_server.h"
#include "common/model/causal_lm.h"
#include "common/rpc/connection_age.h"
#include "common/rpc/draft_context_proto.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/rpc/keepalive.h"
#include "common/rpc/tls.h"
#include "common/tree/drafter_kind.h"
#include "common/util/log.h"
#include "common/util/malloc_tuning.h"
#include "common/util/shutdown_signal.h"
#include "common/util/status_macros.h"
#include "drafter_service/dflash_drafter.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter_registry.h"
#include "drafter_service/drafter_service.h"
#include "drafter_service/ngram_drafter.h"
#include "drafter_service/replay_drafter.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 0, "port to listen on; 0 = pick a free one (printed on stdout)");
ABSL_FLAG(std::string, device, "auto",
          "draft model backend: auto (CUDA when a GPU is present), cpu, cuda or cuda:N");
ABSL_FLAG(std::string, draft_model, "",
          "draft model dir (config.json + safetensors); empty = ngram only");
ABSL_FLAG(std::string, dflash, "",
          "DFlash drafter directory (Hugging Face DFlashDraftModel: config.json + safetensors); "
          "serves mode DFLASH, with --dflash_target");
ABSL_FLAG(std::string, dflash_target, "",
          "the target model directory the --dflash drafter was trained for: its embedding and "
          "LM head are the drafter's (only those two tensors are read)");
ABSL_FLAG(std::string, replay, "",
          "benchmarks only: serve mode REPLAY from this record of the target's greedy outputs "
          "(treespec-loadgen --record_tokens), each proposed token replaced at "
          "--replay_replace_rate (drafter_service/replay_drafter.h)");
ABSL_FLAG(double, replay_replace_rate, 0.25,
          "replay drafter: chance that a proposed token is replaced by a random one");
ABSL_FLAG(int, replay_width, 1, "replay drafter: candidates per depth (1 = chains)");
ABSL_FLAG(uint64_t, replay_seed, 0, "replay drafter: seed of the replacements");
ABSL_FLAG(std::string, default_mode, "",
          "drafter for mode AUTO: draft_model, dflash or ngram; empty = draft_model when "
          "--draft_model is set, else dflash when --dflash is, else ngram");
ABSL_FLAG(std::string, tree_mode, "tree", "draft-model and DFlash tree shape: tree or chain");
ABSL_FLAG(int, expand_per_depth, 0,
          "draft-model tree mode: most nodes expanded per depth; 0 = exact best-first tree "
          "(a CPU drafter may want 4)");
ABSL_FLAG(int, tree_budget, 16,
          "drafted nodes per tree (bonus excluded) for a session that asks for none");
ABSL_FLAG(int, max_depth, 8, "deepest drafted node for a session that asks for none");
ABSL_FLAG(int, max_tree_budget, 512,
          "largest tree a session runs with (a session asking more gets this many); the "
          "verifiers learn it and refuse requests above the largest of their drafters'");
ABSL_FLAG(int, top_k, 0,
          "draft-model tree mode: children ranked per expanded node; 0 = the tree budget (at "
          "most --max_tree_budget)");
ABSL_FLAG(int, threads, 0,
          "drafting threads; 0 = min(4, cores), or with --draft_model at least --max_sessions "
          "(a session's task waits while its forwards run batched with the others')");
ABSL_FLAG(int, vocab_size, 0,
          "token ids must be < this; 0 = the draft model's vocab (no upper check without one)");
ABSL_FLAG(std::string, prefix_cache, "on",
          "on = a draft-model or DFlash session that ends leaves the full KV pages of its "
          "context (DFlash: of its context rows) cached, keyed as the verifier's prefix cache; "
          "a draft-model prompt reuses the longest cached prefix, a DFlash session the rows of "
          "the prefix its verifier reuses; off = every prompt is computed whole");
ABSL_FLAG(int, max_sessions, 64, "concurrent sessions the draft model's KV cache is sized for");
ABSL_FLAG(int, ngram_min, 1, "shortest context suffix the ngram drafter matches");
ABSL_FLAG(int, ngram_max, 4, "longest context suffix the ngram drafter matches");
ABSL_FLAG(int, drain_seconds, 30,
          "on SIGTERM/SIGINT: health goes NOT_SERVING (verifiers open new sessions elsewhere) and "
          "running sessions, each as long as its request, get this long to end before they are "
          "cancelled (keep the pod's termination grace period above it)");
ABSL_FLAG(int, max_connection_age_s, 300,
          "connections older than this are closed (their running sessions get --drain_seconds "
          "to end), so verifiers re-resolve the drafter pool's name and find added drafters; "
          "0 = never");
ABSL_FLAG(int, session_idle_timeout_s, 60,
          "end a session whose verifier has sent nothing for this long (a verifier that died or "
          "hung without closing its streams); 0 = never");
ABSL_FLAG(int, keepalive_s, 30,
          "ping a verifier connection quiet for this long and drop it (with its sessions) when "
          "no answer comes within 10 s; verifiers may ping every half of this (their own "
          "--keepalive_s); 0 = off");
ABSL_FLAG(int, max_message_bytes, 4 << 20,
          "largest message accepted, in bytes; a bigger one fails its session with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: verifiers must present a certificate it signed (mutual TLS; needs --tls_cert)");
ABSL_FLAG(int, metrics_port, 0,
          "HTTP port of the Prometheus /metrics endpoint on --host; 0 picks a free one (printed "
          "as 'metrics on HOST:PORT'), -1 turns it off");

namespace treespec {
namespace {

// The verifiers watch the drafters' health (client-side health checking) and stop opening
// sessions on one that reports NOT_SERVING within milliseconds; this long is left for that
// before new sessions are refused, so no request loses its drafting to the drain.
constexpr absl::Duration kHealthPropagation = absl::Milliseconds(500);

// On a shutdown signal: NOT_SERVING, then wait (up to `drain`) for the running sessions to end,
// which they do when their requests end; then stop, cancelling any left.
void Drain(grpc::Server& server, const DrafterService& service, int signal, absl::Duration drain) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + drain;
  server.GetHealthCheckService()->SetServingStatus(false);
  TS_LOG(kInfo, "signal %d: draining %d sessions, up to %s", signal, service.active_sessions(),
         absl::FormatDuration(drain));
  while (absl::Now() < deadline &&
         (service.active_sessions() > 0 || absl::Now() < start + kHealthPropagation)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (const int left = service.active_sessions(); left == 0) {
    TS_LOG(kInfo, "shutting down: drained");
  } else {
    TS_LOG(kWarning, "shutting down: the drain deadline passed, cancelling %d sessions", left);
  }
  // New sessions are refused from here; one that slipped in since gets what is left of the
  // drain.
  server.Shutdown(absl::ToChronoTime(std::max(deadline, absl::Now())));
  server.Wait();
}

absl::Status Run() {
  const int drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  const int max_connection_age_s = absl::GetFlag(FLAGS_max_connection_age_s);
  const int keepalive_s = absl::GetFlag(FLAGS_keepalive_s);
  const int max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  for (const auto& [name, value] : {std::pair{"--drain_seconds", drain_seconds},
                                    std::pair{"--max_connection_age_s", max_connection_age_s},
                                    std::pair{"--keepalive_s", keepalive_s}}) {
    if (value < 0)
      return absl::InvalidArgumentError(absl::StrCat(name, "=", value, ": must be >= 0"));
  }
  if (max_message_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", max_message_bytes, ": must be >= 1"));
  }
  DrafterServiceOptions options;
  options.spec.defaults = {absl::GetFlag(FLAGS_tree_budget), absl::GetFlag(FLAGS_max_depth),
                           absl::GetFlag(FLAGS_top_k)};
  const int max_tree_budget = absl::GetFlag(FLAGS_max_tree_budget);
  options.spec.max = {max_tree_budget, kSpecCeiling.max_depth, max_tree_budget};
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.worker_threads = absl::GetFlag(FLAGS_threads);
  options.session_idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_session_idle_timeout_s));
  if (options.worker_threads == 0) {
    options.worker_threads =
        static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
    // A draft-model or DFlash session's task waits while the batcher runs its forwards with
    // every other session's: one thread per session lets all of them share each batched forward.
    if (!absl::GetFlag(FLAGS_draft_model).empty() || !absl::GetFlag(FLAGS_dflash).empty()) {
      options.worker_threads = std::max(options.worker_threads, absl::GetFlag(FLAGS_max_sessions));
    }
  }

  NgramOptions ngram_options;
  ngram_options.min_ngram = absl::GetFlag(FLAGS_ngram_min);
  ngram_options.max_ngram = absl::GetFlag(FLAGS_ngram_max);
  if (absl::Status s = ValidateNgramOptions(ngram_options); !s.ok()) return s;
  DrafterRegistry drafters;
  drafters.Add(DrafterKind::kNgram, std::make_unique<NgramDrafterFactory>(ngram_options));

  const std::string shape = absl::GetFlag(FLAGS_tree_mode);
  if (shape != "tree" && shape != "chain") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tree_mode must be tree or chain, got '", shape, "'"));
  }
  const DraftShape draft_shape = shape == "tree" ? DraftShape::kTree : DraftShape::kChain;
  const std::string prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  if (prefix_cache != "on" && prefix_cache != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefix_cache=", prefix_cache, ": want on or off"));
  }
  const std::string model_dir = absl::GetFlag(FLAGS_draft_model);
  if (!model_dir.empty()) {
    DraftModelOptions model_options;
    model_options.shape = draft_shape;
    model_options.max_expand_per_depth = absl::GetFlag(FLAGS_expand_per_depth);
    model_options.prefix_cache = prefix_cache == "on";
    // Children of the bonus, at most: a session's top_k (or, unset, its tree budget).
    model_options.max_top_k = std::max(options.spec.max.tree_budget, options.spec.max.top_k);
    if (model_options.max_expand_per_depth < 0) {
      return absl::InvalidArgumentError("--expand_per_depth must be >= 0");
    }
    LmOptions lm_options;
    lm_options.max_batch = absl::GetFlag(FLAGS_max_sessions);
    absl::StatusOr<std::unique_ptr<CausalLm>> lm =
        LoadCausalLm(model_dir, absl::GetFlag(FLAGS_device), lm_options);
    if (!lm.ok()) {
      return absl::Status(lm.status().code(),
                          absl::StrCat("--draft_model=", model_dir, ": ", lm.status().message()));
    }
    const int model_vocab = (*lm)->config().vocab_size;
    if (options.vocab_size != 0 && options.vocab_size != model_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab_size=", options.vocab_size, " disagrees with the draft model's ", model_vocab));
    }
    options.vocab_size = model_vocab;
    TS_LOG(kInfo, "draft model %s on %s: %d layers x %d, vocab %d, window %d, %s mode", model_dir,
           (*lm)->device(), (*lm)->config().num_layers, (*lm)->config().hidden_size, model_vocab,
           (*lm)->config().max_position_embeddings, shape);
    drafters.Add(DrafterKind::kDraftModel,
                 std::make_unique<DraftModelDrafterFactory>(*std::move(lm), model_options));
  }

  const std::string dflash_dir = absl::GetFlag(FLAGS_dflash);
  const std::string dflash_target = absl::GetFlag(FLAGS_dflash_target);
  if (dflash_dir.empty() != dflash_target.empty()) {
    return absl::InvalidArgumentError(
        "--dflash and --dflash_target go together: the drafter uses its target's embedding and "
        "LM head");
  }
  if (!dflash_dir.empty()) {
    // Commit 0 carries the prompt's feature rows in parts of up to kFeaturePartBytes.
    if (max_message_bytes < static_cast<int>(2 * kFeaturePartBytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max_message_bytes=", max_message_bytes, ": a DFlash drafter needs >= ",
                       2 * kFeaturePartBytes, " (feature rows travel in 1 MiB parts)"));
    }
    LmOptions lm_options;
    lm_options.max_batch = absl::GetFlag(FLAGS_max_sessions);
    absl::StatusOr<DflashLm> dflash =
        LoadDflashLm(dflash_dir, dflash_target, absl::GetFlag(FLAGS_device), lm_options);
    if (!dflash.ok()) {
      return absl::Status(dflash.status().code(),
                          absl::StrCat("--dflash=", dflash_dir, ": ", dflash.status().message()));
    }
    const DflashConfig& config = dflash->config;
    if (options.vocab_size != 0 && options.vocab_size != config.body.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("--vocab_size=", options.vocab_size,
                                                     " disagrees with the DFlash drafter's ",
                                                     config.body.vocab_size));
    }
    options.vocab_size = config.body.vocab_size;
    TS_LOG(kInfo, "DFlash drafter %s on %s: %d layers x %d, block %d, reads %s of %s, %s mode",
           dflash_dir, dflash->lm->device(), config.body.num_layers, config.body.hidden_size,
           config.block_size, FeatureSpecString(config.features()),
           FeatureTargetString(config.features()), shape);
    drafters.Add(DrafterKind::kDflash, std::make_unique<DflashDrafterFactory>(
                                           std::move(dflash->config), std::move(dflash->lm),
                                           DflashOptions{draft_shape, prefix_cache == "on"}));
  }

  if (const std::string replay = absl::GetFlag(FLAGS_replay); !replay.empty()) {
    ReplayOptions replay_options;
    replay_options.replace_rate = absl::GetFlag(FLAGS_replay_replace_rate);
    replay_options.width = absl::GetFlag(FLAGS_replay_width);
    replay_options.seed = absl::GetFlag(FLAGS_replay_seed);
    if (absl::Status s = ValidateReplayOptions(replay_options); !s.ok()) return s;
    ASSIGN_OR_RETURN(ReplayRecords records, ReplayRecords::Load(replay));
    if (options.vocab_size != 0 && records.vocab_bound() > options.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--replay=", replay, " holds token ", records.vocab_bound() - 1,
                       ", outside the vocabulary of ", options.vocab_size));
    }
    TS_LOG(kInfo, "replay drafter: %d records from %s, replace rate %.3f, width %d", records.size(),
           replay, replay_options.replace_rate, replay_options.width);
    drafters.Add(DrafterKind::kReplay,
                 std::make_unique<ReplayDrafterFactory>(
                     std::make_shared<const ReplayRecords>(std::move(records)), replay_options));
  }

  // Unset: the draft model where there is one, else DFlash, else ngram.
  const std::string mode = absl::GetFlag(FLAGS_default_mode);
  if (mode.empty()) {
    options.default_kind = drafters.Find(DrafterKind::kDraftModel) != nullptr
                               ? DrafterKind::kDraftModel
                           : drafters.Find(DrafterKind::kDflash) != nullptr ? DrafterKind::kDflash
                                                                            : DrafterKind::kNgram;
  } else if (const std::optional<DrafterKind> kind = DrafterKindFromName(mode)) {
    options.default_kind = *kind;
  } else {
    std::vector<DrafterKind> all;
    for (const DrafterKindInfo& info : AllDrafterKinds()) all.push_back(info.kind);
    return absl::InvalidArgumentError(absl::StrCat("--default_mode must be one of ",
                                                   DrafterKindNames(all), ", got '", mode, "'"));
  }
  if (absl::Status s = ValidateDrafterServiceOptions(options, drafters); !s.ok()) return s;

  DrafterMetrics metrics;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (const int metrics_port = absl::GetFlag(FLAGS_metrics_port); metrics_port >= 0) {
    ASSIGN_OR_RETURN(metrics_server,
                     MetricsHttpServer::Start(absl::GetFlag(FLAGS_host), metrics_port, &metrics));
  }
  DrafterService service(options, std::move(drafters), &metrics);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  ASSIGN_OR_RETURN(auto credentials,
                   MakeServerCredentials({.cert = absl::GetFlag(FLAGS_tls_cert),
                                          .key = absl::GetFlag(FLAGS_tls_key),
                                          .ca = absl::GetFlag(FLAGS_tls_client_ca),
                                          .ca_flag = "--tls_client_ca"}));
  grpc::ServerBuilder builder;
  const std::string host = absl::GetFlag(FLAGS_host);
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)), credentials, &port);
  builder.RegisterService(&service);
  SetMaxConnectionAge(builder, max_connection_age_s, drain_seconds);
  SetServerKeepalive(builder, keepalive_s);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", absl::GetFlag(FLAGS_port)));
  }
  // The model (if any) is loaded: ready.
  server->GetHealthCheckService()->SetServingStatus(true);
  if (metrics_server != nullptr) {
    std::printf("treespec-drafter metrics on %s:%d\n", host.c_str(), metrics_server->port());
  }
  std::printf("treespec-drafter listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  TS_LOG(kInfo, "serving as %s: default mode %s, %d drafting threads, defaults %s, maxima %s",
         service.info().drafter_id(), DrafterKindName(options.default_kind), options.worker_threads,
         SpecLimitsString(options.spec.defaults), SpecLimitsString(options.spec.max));

  const int signal = WaitForShutdownSignal();
  Drain(*server, service, signal, absl::Seconds(drain_seconds));
  TS_LOG(kInfo, "stopped after %d sessions", static_cast<int>(service.total_sessions()));
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec

int main(int argc, char** argv) {
  treespec::BlockShutdownSignals();
  treespec::KeepLargeBuffersInHeap();
  absl::SetProgramUsageMessage("Serves treespec.v1.Drafter: draft trees for speculative decoding.");
  absl::ParseCommandLine(argc, argv);
  // Every gRPC object lives in Run: gRPC shuts down before the process exits.
  const absl::Status status = treespec::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "treespec-drafter: %s\n", status.ToString().c_str());
  }
  return treespec::AfterGrpcShutdown(status.ok() ? 0 : 1);
}
