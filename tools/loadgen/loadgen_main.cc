// treespec-loadgen: the load-test harness for treespec verifiers (issue 4), in the manner of
// vLLM's serving benchmark (`vllm bench serve`): same arrival processes, metric definitions and
// summary key names, plus speculation figures cross-checked against the servers' counters.
//
//   treespec-loadgen --target=127.0.0.1:50051 --num_prompts=200 --request_rate=4 \
//       --random_input_len=128 --random_output_len=64 --result_json=/tmp/run.json
//   treespec-loadgen --target=HOST:P1,HOST:P2 --dataset_path=tests/data/heldout_prompts.jsonl \
//       --max_concurrency=8 --metrics_urls=HOST:M1,HOST:M2 --check_metrics
//
// Exit status: 0 after a run (failed requests are counted in the summary), 1 when the run could
// not be made or --check_metrics found the counters disagreeing, 2 for bad flags.
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/util/status_macros.h"
#include "tools/loadgen/benchmark.h"
#include "tools/loadgen/run_config.h"

ABSL_FLAG(std::vector<std::string>, target, {"127.0.0.1:50051"},
          "verifier addresses (gRPC targets), comma-separated; requests go round-robin over them");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA that signed the verifiers' certificates: use TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS, with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the bearer token every call sends (verifiers run with "
          "--auth_token_file); empty = none");
ABSL_FLAG(std::string, dataset_name, "",
          "random or jsonl; empty = jsonl when --dataset_path is set, else random");
ABSL_FLAG(std::string, dataset_path, "",
          "JSONL prompts, one {\"text\": ...} object per line (tests/data/heldout_prompts.jsonl)");
ABSL_FLAG(int, jsonl_output_len, 128, "tokens to generate for each JSONL prompt");
ABSL_FLAG(int, random_input_len, 1024, "random dataset: mean prompt tokens");
ABSL_FLAG(int, random_output_len, 128, "random dataset: mean tokens to generate");
ABSL_FLAG(double, random_range_ratio, 0.0,
          "random dataset: lengths uniform in [len * (1 - r), len * (1 + r)], r in [0, 1)");
ABSL_FLAG(int, random_vocab_size, 0, "random dataset: token ids from [0, this); 0 = the servers'");
ABSL_FLAG(std::string, workload, "requests",
          "requests: the dataset's prompts, independent; conversation: --conversations "
          "multi-turn conversations side by side, each turn resending the history (turn 1: "
          "--history_len random tokens; each later turn adds the previous answer and "
          "--turn_input_len new tokens; --random_output_len tokens per answer), TTFT and cached "
          "tokens reported per turn; mixed: --streams decode streams run while the dataset's "
          "prompts arrive, the streams' inter-token gaps reported apart");
ABSL_FLAG(int, conversations, 4, "conversation workload: conversations side by side");
ABSL_FLAG(int, turns, 8, "conversation workload: turns per conversation");
ABSL_FLAG(int, history_len, 1024, "conversation workload: tokens of turn 1's prompt");
ABSL_FLAG(int, turn_input_len, 128, "conversation workload: new tokens each later turn adds");
ABSL_FLAG(double, think_time_ms, 0,
          "conversation workload: pause between an answer's end and the next turn");
ABSL_FLAG(int, streams, 8,
          "mixed workload: decode streams kept running until every prompt has been sent");
ABSL_FLAG(int, stream_input_len, 128, "mixed workload: prompt tokens of a stream");
ABSL_FLAG(int, stream_output_len, 512, "mixed workload: tokens a stream generates");
ABSL_FLAG(std::string, mode, "auto",
          "speculation mode: auto, off, ngram, draft_model, dflash or replay");
ABSL_FLAG(int, tree_budget, 0, "drafted nodes per step; 0 = server default");
ABSL_FLAG(int, max_depth, 0, "deepest drafted node; 0 = server default");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature; 0 = greedy");
ABSL_FLAG(double, top_p, 0.0, "nucleus mass in (0, 1]; 0 = unset");
ABSL_FLAG(int, top_k, 0, "top-k; 0 = no limit");
ABSL_FLAG(bool, ignore_eos, true,
          "generate past EOS so every request produces its full output length");
ABSL_FLAG(int, num_prompts, 1000, "requests to send");
ABSL_FLAG(int, num_warmups, 0, "unmeasured requests sent first");
ABSL_FLAG(double, request_rate, std::numeric_limits<double>::infinity(),
          "requests per second (open loop); inf = all at once");
ABSL_FLAG(std::string, arrival, "poisson", "arrival process: poisson, gamma or constant");
ABSL_FLAG(double, burstiness, 1.0,
          "gamma shape: < 1 burstier than Poisson, > 1 smoother (--arrival=gamma)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the dataset, the arrivals and (+ index) request sampling");
ABSL_FLAG(int, max_concurrency, 0, "requests in flight at most (closed loop); 0 = no bound");
ABSL_FLAG(double, duration_s, 0, "send no request after this many seconds; 0 = no bound");
ABSL_FLAG(double, request_timeout_s, 600, "deadline of each request");
ABSL_FLAG(double, connect_timeout_s, 10,
          "how long each target may take to answer GetModelInfo at the start");
ABSL_FLAG(bool, failover, true,
          "send a request refused with UNAVAILABLE before any token on to the next target");
ABSL_FLAG(double, cancel_fraction, 0,
          "share of the requests the client cancels (seeded by --seed): half before their first "
          "token, half after a random number of tokens; counted as cancelled, not failed, and "
          "left out of the latency figures");
ABSL_FLAG(double, cancel_delay_ms, 100,
          "a before-first-token cancel comes this long at most after the send (uniform), or at "
          "the first token if that is sooner");
ABSL_FLAG(std::string, percentiles, "99", "percentiles to report, comma-separated");
ABSL_FLAG(std::string, goodput, "",
          "SLOs for goodput in ms, e.g. ttft:500,tpot:50,e2el:2000 (vLLM's --goodput)");
ABSL_FLAG(std::vector<std::string>, metrics_urls, {},
          "the verifiers' Prometheus endpoints (HOST:PORT or http://HOST:PORT/metrics), "
          "comma-separated: their speculation counters are scraped before and after the run and "
          "compared with the requests' figures");
ABSL_FLAG(bool, check_metrics, false, "exit 1 when the counters' deltas differ from the harness's");
ABSL_FLAG(std::string, requests_jsonl, "", "write one JSON line per request here");
ABSL_FLAG(std::string, record_tokens, "",
          "write each completed request's prompt and output token ids here (JSON lines): the "
          "record treespec-drafter --replay replays; token-id prompts (random dataset) only");
ABSL_FLAG(std::string, result_json, "", "write the summary JSON here");
ABSL_FLAG(std::string, result_csv, "", "write the summary as a one-row CSV here");
ABSL_FLAG(bool, progress, true, "show a progress bar when stderr is a terminal");

namespace {

using treespec::loadgen::RunConfig;

// The flags as a RunConfig; the first flag that does not parse as an error naming it.
absl::StatusOr<RunConfig> ConfigFromFlags() {
  namespace lg = treespec::loadgen;
  RunConfig c;
  c.targets = absl::GetFlag(FLAGS_target);
  c.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  ASSIGN_OR_RETURN(c.dataset, lg::ParseDatasetKind(absl::GetFlag(FLAGS_dataset_name),
                                                   absl::GetFlag(FLAGS_dataset_path)));
  c.dataset_path = absl::GetFlag(FLAGS_dataset_path);
  c.jsonl_output_len = absl::GetFlag(FLAGS_jsonl_output_len);
  c.random_input_len = absl::GetFlag(FLAGS_random_input_len);
  c.random_output_len = absl::GetFlag(FLAGS_random_output_len);
  c.random_range_ratio = absl::GetFlag(FLAGS_random_range_ratio);
  c.random_vocab_size = absl::GetFlag(FLAGS_random_vocab_size);
  ASSIGN_OR_RETURN(c.workload, lg::ParseWorkloadKind(absl::GetFlag(FLAGS_workload)));
  c.conversations = absl::GetFlag(FLAGS_conversations);
  c.turns = absl::GetFlag(FLAGS_turns);
  c.history_len = absl::GetFlag(FLAGS_history_len);
  c.turn_input_len = absl::GetFlag(FLAGS_turn_input_len);
  c.think_time_ms = absl::GetFlag(FLAGS_think_time_ms);
  c.streams = absl::GetFlag(FLAGS_streams);
  c.stream_input_len = absl::GetFlag(FLAGS_stream_input_len);
  c.stream_output_len = absl::GetFlag(FLAGS_stream_output_len);
  ASSIGN_OR_RETURN(const treespec::v1::SpeculationMode mode,
                   lg::ParseSpeculationMode(absl::GetFlag(FLAGS_mode)));
  c.request = {.mode = mode,
               .tree_budget = absl::GetFlag(FLAGS_tree_budget),
               .max_depth = absl::GetFlag(FLAGS_max_depth),
               .temperature = absl::GetFlag(FLAGS_temperature),
               .top_p = absl::GetFlag(FLAGS_top_p),
               .top_k = absl::GetFlag(FLAGS_top_k),
               .seed = absl::GetFlag(FLAGS_seed),
               .ignore_eos = absl::GetFlag(FLAGS_ignore_eos)};
  c.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  c.num_warmups = absl::GetFlag(FLAGS_num_warmups);
  c.request_rate = absl::GetFlag(FLAGS_request_rate);
  absl::StatusOr<lg::ArrivalProcess> arrival =
      lg::ParseArrivalProcess(absl::GetFlag(FLAGS_arrival));
  if (!arrival.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--arrival: ", arrival.status().message()));
  }
  c.arrival = *arrival;
  c.burstiness = absl::GetFlag(FLAGS_burstiness);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  c.duration_s = absl::GetFlag(FLAGS_duration_s);
  c.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  c.connect_timeout_s = absl::GetFlag(FLAGS_connect_timeout_s);
  c.failover = absl::GetFlag(FLAGS_failover);
  c.cancel_fraction = absl::GetFlag(FLAGS_cancel_fraction);
  c.cancel_delay_ms = absl::GetFlag(FLAGS_cancel_delay_ms);
  ASSIGN_OR_RETURN(c.percentiles, lg::ParsePercentiles(absl::GetFlag(FLAGS_percentiles)));
  ASSIGN_OR_RETURN(c.slo, lg::ParseGoodput(absl::GetFlag(FLAGS_goodput)));
  c.metrics_urls = absl::GetFlag(FLAGS_metrics_urls);
  c.check_metrics = absl::GetFlag(FLAGS_check_metrics);
  c.requests_jsonl = absl::GetFlag(FLAGS_requests_jsonl);
  c.record_tokens = absl::GetFlag(FLAGS_record_tokens);
  c.result_json = absl::GetFlag(FLAGS_result_json);
  c.result_csv = absl::GetFlag(FLAGS_result_csv);
  c.progress = absl::GetFlag(FLAGS_progress);
  RETURN_IF_ERROR(lg::ValidateRunConfig(c));
  return c;
}

// Every gRPC object lives in here: main waits for gRPC's shutdown after it returns.
int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load test for treespec verifiers: treespec-loadgen --target=HOST:PORT[,...] [--flags]");
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    std::fprintf(stderr, "treespec-loadgen: unexpected argument '%s' (flags are --name=value)\n",
                 args[1]);
    return 2;
  }
  absl::StatusOr<RunConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "treespec-loadgen: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<treespec::loadgen::BenchmarkOutcome> outcome =
      treespec::loadgen::RunBenchmark(*config);
  if (!outcome.ok()) {
    std::fprintf(stderr, "treespec-loadgen: %s\n", std::string(outcome.status().message()).c_str());
    return 1;
  }
  if (!outcome->metrics_check_passed) {
    const nlohmann::json& check = outcome->summary["metrics_check"];
    std::fprintf(
        stderr, "treespec-loadgen: the servers' counters disagree with the requests: %s\n",
        check.contains("error")
            ? check["error"].get<std::string>().c_str()
            : absl::StrJoin(check["mismatches"].get<std::vector<std::string>>(), "; ").c_str());
    if (config->check_metrics) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return treespec::AfterGrpcShutdown(Main(argc, argv)); }
