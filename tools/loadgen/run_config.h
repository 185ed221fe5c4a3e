// What one treespec-loadgen run does, as its flags set it, and the checks that turn a bad flag
// into a message naming it (before anything connects).
#ifndef TREESPEC_TOOLS_LOADGEN_RUN_CONFIG_H_
#define TREESPEC_TOOLS_LOADGEN_RUN_CONFIG_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/loadgen/arrivals.h"
#include "tools/loadgen/serving_stats.h"
#include "treespec/v1/generation.pb.h"

namespace treespec::loadgen {

enum class DatasetKind { kRandom, kJsonl };

// What shapes the requests: independent ones from the dataset; multi-turn conversations
// (conversation.h); or the dataset's prompts arriving while decode streams run (mixed_load.h).
enum class WorkloadKind { kRequests, kConversation, kMixed };

// What every request carries besides its prompt.
struct RequestOptions {
  v1::SpeculationMode mode = v1::SPECULATION_MODE_AUTO;
  int tree_budget = 0;  // 0 = server default
  int max_depth = 0;    // 0 = server default
  double temperature = 0;
  double top_p = 0;  // 0 = unset
  int top_k = 0;
  uint64_t seed = 0;       // request i samples with seed + i
  bool ignore_eos = true;  // every request generates its full output length
};

struct RunConfig {
  // Where: verifier addresses (gRPC targets), requests go round-robin over them.
  std::vector<std::string> targets;
  // TLS to the verifiers (PEM files; empty ca = plaintext): ca checks their certificate, cert and
  // key are the client's for mutual TLS.
  std::string tls_ca, tls_cert, tls_key;
  // Its first line is the bearer token every call carries (verifiers with --auth_token_file).
  std::string auth_token_file;
  // What: the dataset.
  DatasetKind dataset = DatasetKind::kRandom;
  std::string dataset_path;  // JSONL
  int jsonl_output_len = 128;
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  int random_vocab_size = 0;  // 0 = the servers' vocabulary
  WorkloadKind workload = WorkloadKind::kRequests;
  // kConversation: conversations side by side, each `turns` turns (output random_output_len
  // tokens each); turn 1 is `history_len` tokens, later turns add `turn_input_len`.
  int conversations = 4;
  int turns = 8;
  int history_len = 1024;
  int turn_input_len = 128;
  double think_time_ms = 0;
  // kMixed: decode streams kept running while the dataset's prompts arrive.
  int streams = 8;
  int stream_input_len = 128;
  int stream_output_len = 512;
  // Each request's generation settings; request.seed is set to `seed`.
  RequestOptions request;
  // How much and when.
  int num_prompts = 1000;
  int num_warmups = 0;
  double request_rate = std::numeric_limits<double>::infinity();
  ArrivalProcess arrival = ArrivalProcess::kPoisson;
  double burstiness = 1.0;
  uint64_t seed = 0;        // dataset, arrivals, and (seed + request index) each request's sampling
  int max_concurrency = 0;  // 0 = no bound
  double duration_s = 0;    // stop sending after this long; 0 = no bound
  double request_timeout_s = 600;
  double connect_timeout_s = 10;  // for every target to answer GetModelInfo at the start
  bool failover = true;  // retry a request refused (UNAVAILABLE, no token yet) on another target
  // Cancels by the client (cancel_plan.h): this share of the requests, chosen with `seed`, half
  // before their first token (at a delay uniform in [0, cancel_delay_ms]) and half mid-stream.
  double cancel_fraction = 0;
  double cancel_delay_ms = 100;
  // What is reported.
  std::vector<double> percentiles = {99};
  Slo slo;
  std::vector<std::string> metrics_urls;  // the verifiers' /metrics, for the cross-check
  bool check_metrics = false;             // exit non-zero when the cross-check fails
  std::string requests_jsonl, result_json, result_csv;
  // Each completed request's prompt and output token ids, one JSON line each: the record the
  // replay drafter replays (treespec-drafter --replay). Token-id prompts (the random dataset)
  // only.
  std::string record_tokens;
  bool progress = true;  // a progress bar when stderr is a terminal
};

// "ttft:500,tpot:50" or "ttft:500 tpot:50" (vLLM's --goodput; milliseconds, keys ttft, tpot,
// e2el, each at most once, values finite and >= 0). InvalidArgument naming the bad item.
absl::StatusOr<Slo> ParseGoodput(absl::string_view spec);

// "99" or "50,90,99.9": each in [0, 100]. InvalidArgument naming the bad item.
absl::StatusOr<std::vector<double>> ParsePercentiles(absl::string_view spec);

// auto, off, ngram, draft_model, dflash or replay.
absl::StatusOr<v1::SpeculationMode> ParseSpeculationMode(absl::string_view name);

// requests, conversation or mixed.
absl::StatusOr<WorkloadKind> ParseWorkloadKind(absl::string_view name);

// random, jsonl, or "" (jsonl when `dataset_path` is set, else random).
absl::StatusOr<DatasetKind> ParseDatasetKind(absl::string_view name,
                                             absl::string_view dataset_path);

// Every range and combination, with the flag named: InvalidArgument for the first bad one.
absl::Status ValidateRunConfig(const RunConfig& config);

// The settings as JSON for the summary (an infinite rate is written "inf").
nlohmann::json ToJson(const RunConfig& config);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_RUN_CONFIG_H_
