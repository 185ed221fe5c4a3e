#include "tools/loadgen/benchmark.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/bearer_auth.h"
#include "common/rpc/tls.h"
#include "common/util/status_macros.h"
#include "tools/loadgen/arrivals.h"
#include "tools/loadgen/cancel_plan.h"
#include "tools/loadgen/conversation.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/driver.h"
#include "tools/loadgen/mixed_load.h"
#include "tools/loadgen/output.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/spec_counters.h"

namespace treespec::loadgen {
namespace {

constexpr size_t kMaxErrorKinds = 10;
// Warm-up prompts are drawn with the run's seed xor this, so they differ from the measured ones.
constexpr uint64_t kWarmupSeed = 0x5741524d;

// The vocabulary and context every target serves (the smallest context), or an error when the
// targets serve different vocabularies.
absl::StatusOr<v1::ModelInfo> CommonModel(const std::vector<std::string>& targets,
                                          const std::vector<v1::ModelInfo>& infos) {
  v1::ModelInfo common = infos[0];
  for (size_t t = 1; t < infos.size(); ++t) {
    if (infos[t].vocab_size() != common.vocab_size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the targets serve different vocabularies: ", targets[0], " has ", common.vocab_size(),
          " tokens, ", targets[t], " has ", infos[t].vocab_size()));
    }
    common.set_context_length(std::min(common.context_length(), infos[t].context_length()));
  }
  return common;
}

// The random dataset, sized to what the servers serve.
absl::StatusOr<std::vector<Prompt>> MakeRandomDataset(const RunConfig& c,
                                                      const v1::ModelInfo& model) {
  const int vocab = c.random_vocab_size > 0 ? c.random_vocab_size : model.vocab_size();
  if (vocab > model.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("--random_vocab_size=", vocab,
                                                   ": the servers' vocabulary has only ",
                                                   model.vocab_size(), " tokens"));
  }
  const LengthRange in = RandomLengthRange(c.random_input_len, c.random_range_ratio);
  const LengthRange out = RandomLengthRange(c.random_output_len, c.random_range_ratio);
  if (in.max + out.max > model.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random_input_len=", c.random_input_len, " and --random_output_len=", c.random_output_len,
        " with --random_range_ratio=", c.random_range_ratio, " reach ", in.max, " + ", out.max,
        " tokens; the servers' context is ", model.context_length()));
  }
  return RandomDataset({.num_prompts = c.num_prompts,
                        .input_len = c.random_input_len,
                        .output_len = c.random_output_len,
                        .range_ratio = c.random_range_ratio,
                        .vocab_size = vocab,
                        .seed = c.seed});
}

// What a run sends: the scheduled prompts, when, and what each leads to.
struct Workload {
  std::vector<Prompt> prompts;
  std::vector<double> send_times;
  FollowUpFn follow_up;  // null: nothing follows
  std::vector<Prompt> warmups;
};

int VocabOf(const RunConfig& c, const v1::ModelInfo& model) {
  return c.random_vocab_size > 0 ? c.random_vocab_size : model.vocab_size();
}

absl::StatusOr<std::vector<double>> SendTimes(const RunConfig& c, int count) {
  return ArrivalTimes(
      {.process = c.arrival, .rate = c.request_rate, .burstiness = c.burstiness, .seed = c.seed},
      count);
}

// Warm-up prompts like the dataset's but not the same ones, which a prefix cache would then
// serve from the warm-up: the random dataset drawn with another seed; a JSONL dataset's own
// first prompts (its texts are all there is).
absl::StatusOr<std::vector<Prompt>> WarmupPrompts(const RunConfig& c, const v1::ModelInfo& model,
                                                  const std::vector<Prompt>& dataset) {
  if (c.dataset == DatasetKind::kJsonl || c.num_warmups == 0) return dataset;
  RunConfig warm = c;
  warm.num_prompts = c.num_warmups;
  warm.seed = c.seed ^ kWarmupSeed;
  return MakeRandomDataset(warm, model);
}

// Conversations: their first turns on the arrival schedule, each later turn after the previous
// answer (and the think time). Warm-ups are first turns of other conversations, so they leave
// nothing in a prefix cache that the measured ones reuse.
absl::StatusOr<Workload> ConversationWorkload(const RunConfig& c, const v1::ModelInfo& model) {
  const ConversationOptions o{.conversations = c.conversations,
                              .turns = c.turns,
                              .history_len = c.history_len,
                              .turn_input_len = c.turn_input_len,
                              .output_len = c.random_output_len,
                              .think_time_s = c.think_time_ms / 1e3,
                              .vocab_size = VocabOf(c, model),
                              .seed = c.seed};
  if (LastTurnTokens(o) > model.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--history_len=", c.history_len, " + (--turns=", c.turns, " - 1) x (--turn_input_len=",
        c.turn_input_len, " + --random_output_len=", c.random_output_len, ") + an answer reach ",
        LastTurnTokens(o), " tokens; the servers' context is ", model.context_length()));
  }
  Workload w;
  w.prompts = FirstTurns(o);
  ASSIGN_OR_RETURN(w.send_times, SendTimes(c, c.conversations));
  w.follow_up = [o](const Prompt& turn, const RequestResult& result,
                    bool /*sent_all*/) -> std::optional<FollowUp> {
    std::optional<Prompt> next = NextTurn(o, turn, result);
    if (!next.has_value()) return std::nullopt;
    return FollowUp{*std::move(next), o.think_time_s, /*same_target=*/true};
  };
  ConversationOptions warm = o;
  warm.conversations = c.num_warmups;
  warm.seed = o.seed ^ kWarmupSeed;
  w.warmups = FirstTurns(warm);
  return w;
}

// Decode streams from the start, the dataset's prompts on the arrival schedule.
absl::StatusOr<Workload> MixedWorkload(const RunConfig& c, const v1::ModelInfo& model,
                                       std::vector<Prompt> dataset) {
  const MixedLoadOptions o{.streams = c.streams,
                           .stream_input_len = c.stream_input_len,
                           .stream_output_len = c.stream_output_len,
                           .vocab_size = VocabOf(c, model),
                           .seed = c.seed};
  if (c.stream_input_len + c.stream_output_len > model.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_input_len=", c.stream_input_len, " + --stream_output_len=", c.stream_output_len,
        " exceed the servers' context ", model.context_length()));
  }
  Workload w;
  for (int i = 0; i < c.streams; ++i) w.prompts.push_back(StreamPrompt(o, i));
  w.send_times.assign(c.streams, 0.0);
  ASSIGN_OR_RETURN(const std::vector<double> times, SendTimes(c, c.num_prompts));
  ASSIGN_OR_RETURN(w.warmups, WarmupPrompts(c, model, dataset));
  for (Prompt& p : dataset) p.group = kLongPromptGroup;
  w.prompts.insert(w.prompts.end(), dataset.begin(), dataset.end());
  w.send_times.insert(w.send_times.end(), times.begin(), times.end());
  // Called under the driver's lock: the counter needs no lock of its own.
  auto serial = std::make_shared<int>(c.streams);
  w.follow_up = [o, serial](const Prompt& ended, const RequestResult& /*result*/,
                            bool sent_all) -> std::optional<FollowUp> {
    std::optional<Prompt> next = NextStream(o, ended, sent_all, *serial);
    if (!next.has_value()) return std::nullopt;
    ++*serial;
    return FollowUp{*std::move(next), 0.0};
  };
  return w;
}

absl::StatusOr<Workload> MakeWorkload(const RunConfig& c, const v1::ModelInfo& model,
                                      std::vector<Prompt> dataset) {
  switch (c.workload) {
    case WorkloadKind::kConversation:
      return ConversationWorkload(c, model);
    case WorkloadKind::kMixed:
      return MixedWorkload(c, model, std::move(dataset));
    case WorkloadKind::kRequests:
      break;
  }
  Workload w;
  ASSIGN_OR_RETURN(w.send_times, SendTimes(c, c.num_prompts));
  ASSIGN_OR_RETURN(w.warmups, WarmupPrompts(c, model, dataset));
  w.prompts = std::move(dataset);
  return w;
}

// Warm-up requests (the workload's warm-up prompts, all sent at once under the concurrency
// bound); any failure is an error: the servers are not ready for a measurement.
absl::Status WarmUp(Driver& driver, const RunConfig& c, const std::vector<Prompt>& prompts,
                    const ScheduleOptions& schedule) {
  std::vector<Prompt> warm;
  for (int i = 0; i < c.num_warmups; ++i) warm.push_back(prompts[i % prompts.size()]);
  ProgressBar bar("warm-up", c.num_warmups, c.progress);
  const RunResult result =
      driver.Run(warm, std::vector<double>(warm.size(), 0.0), {}, c.request, schedule, &bar);
  for (const RequestResult& r : result.requests) {
    if (!r.record.ok) {
      return absl::UnavailableError(
          absl::StrCat("warm-up request ", r.index, " to ", r.target, " failed: ", r.error));
    }
  }
  return absl::OkStatus();
}

// per_target, errors and retried_requests of the summary.
void AddRequestBreakdown(const std::vector<std::string>& targets,
                         const std::vector<RequestResult>& requests, nlohmann::json& summary) {
  struct Counts {
    int completed = 0, failed = 0, cancelled = 0;
  };
  std::map<std::string, Counts> per_target;
  for (const std::string& t : targets) per_target[t] = {};
  std::map<std::string, int> errors;
  int retried = 0;
  for (const RequestResult& r : requests) {
    Counts& counts = per_target[r.target];
    const bool failed = !r.record.ok && !r.record.cancelled;
    ++(r.record.ok ? counts.completed : failed ? counts.failed : counts.cancelled);
    if (failed && (errors.size() < kMaxErrorKinds || errors.count(r.error) > 0)) {
      ++errors[r.error];
    }
    if (r.attempts > 1) ++retried;
  }
  nlohmann::json targets_json = nlohmann::json::object();
  for (const auto& [target, counts] : per_target) {
    targets_json[target] = {{"completed", counts.completed},
                            {"failed", counts.failed},
                            {"cancelled", counts.cancelled}};
  }
  summary["per_target"] = targets_json;
  summary["errors"] = errors;
  summary["retried_requests"] = retried;
}

}  // namespace

absl::StatusOr<BenchmarkOutcome> RunBenchmark(const RunConfig& c) {
  RETURN_IF_ERROR(ValidateRunConfig(c));
  // Fail on an unwritable output now rather than after the run.
  for (const std::string* path :
       {&c.requests_jsonl, &c.result_json, &c.result_csv, &c.record_tokens}) {
    if (!path->empty()) RETURN_IF_ERROR(WriteFile(*path, ""));
  }
  std::vector<HttpUrl> metrics_urls;
  for (const std::string& url : c.metrics_urls) {
    ASSIGN_OR_RETURN(HttpUrl parsed, ParseHttpUrl(url));
    metrics_urls.push_back(std::move(parsed));
  }

  // A JSONL dataset is read before connecting (a bad path fails at once); the random one
  // needs the servers' vocabulary and context.
  std::vector<Prompt> prompts;
  if (c.dataset == DatasetKind::kJsonl) {
    ASSIGN_OR_RETURN(prompts, LoadJsonlDataset(c.dataset_path, c.num_prompts, c.jsonl_output_len));
  }
  ASSIGN_OR_RETURN(auto credentials,
                   MakeChannelCredentials({.cert = c.tls_cert, .key = c.tls_key, .ca = c.tls_ca}));
  ASSIGN_OR_RETURN(std::string token,
                   LoadClientBearerToken(c.auth_token_file, "--auth_token_file"));
  Driver driver(c.targets, std::move(credentials), std::move(token));
  ASSIGN_OR_RETURN(const std::vector<v1::ModelInfo> infos,
                   driver.ModelInfos(absl::Seconds(c.connect_timeout_s)));
  ASSIGN_OR_RETURN(const v1::ModelInfo model, CommonModel(c.targets, infos));
  if (c.dataset == DatasetKind::kRandom && c.workload != WorkloadKind::kConversation) {
    ASSIGN_OR_RETURN(prompts, MakeRandomDataset(c, model));
  }
  ASSIGN_OR_RETURN(Workload workload, MakeWorkload(c, model, std::move(prompts)));
  ScheduleOptions schedule = {.max_concurrency = c.max_concurrency,
                              .duration_s = c.duration_s,
                              .request_timeout_s = c.request_timeout_s,
                              .failover = c.failover};
  if (c.num_warmups > 0) {
    ScheduleOptions warm_schedule = schedule;
    warm_schedule.duration_s = 0;
    RETURN_IF_ERROR(WarmUp(driver, c, workload.warmups, warm_schedule));
  }
  schedule.follow_up = workload.follow_up;

  SpecCounters before;
  if (!metrics_urls.empty()) {
    absl::StatusOr<SpecCounters> scraped = ScrapeSpecCounters(metrics_urls);
    if (!scraped.ok()) {
      return absl::Status(scraped.status().code(), absl::StrCat("--metrics_urls, before the run: ",
                                                                scraped.status().message()));
    }
    before = *scraped;
  }
  std::vector<int> output_lens;
  for (const Prompt& p : workload.prompts) output_lens.push_back(p.output_len);
  const std::vector<CancelPoint> cancels = PlanCancels(
      {.fraction = c.cancel_fraction, .max_delay_ms = c.cancel_delay_ms, .seed = c.seed},
      output_lens);
  const absl::Time started = absl::Now();
  RunResult run;
  {
    const int expected = c.workload == WorkloadKind::kConversation
                             ? c.conversations * c.turns
                             : static_cast<int>(workload.prompts.size());
    ProgressBar bar("requests", expected, c.progress);
    run = driver.Run(workload.prompts, workload.send_times, cancels, c.request, schedule, &bar);
  }

  std::vector<RequestRecord> records;
  records.reserve(run.requests.size());
  for (const RequestResult& r : run.requests) records.push_back(r.record);
  BenchmarkOutcome outcome;
  nlohmann::json& summary = outcome.summary;
  summary = Summarize(records, run.duration_s, c.percentiles, c.slo);
  summary["date"] = absl::FormatTime("%Y%m%d-%H%M%S", started, absl::LocalTimeZone());
  summary["backend"] = "treespec";
  summary["model_id"] = model.model_name();
  summary["num_prompts"] = c.num_prompts;
  summary["request_rate"] = ToJson(c)["request_rate"];
  summary["burstiness"] = c.burstiness;
  summary["max_concurrency"] =
      c.max_concurrency > 0 ? nlohmann::json(c.max_concurrency) : nlohmann::json(nullptr);
  summary["not_sent"] = run.not_sent;
  AddRequestBreakdown(c.targets, run.requests, summary);
  if (c.workload == WorkloadKind::kConversation) {
    summary["turns"] = SummarizeTurns(run.prompts, run.requests, c.percentiles);
  } else if (c.workload == WorkloadKind::kMixed) {
    summary["groups"] = SummarizeMixed(run.prompts, run.requests, run.duration_s, c.percentiles);
  }
  summary["config"] = ToJson(c);

  if (!metrics_urls.empty()) {
    nlohmann::json check = {{"urls", c.metrics_urls}};
    absl::StatusOr<SpecCounters> after = ScrapeSpecCounters(metrics_urls);
    if (!after.ok()) {
      check["error"] = absl::StrCat("after the run: ", after.status().message());
      check["ok"] = false;
    } else {
      const SpecCounters delta = Subtract(*after, before);
      // The servers count a cancelled request's steps, the harness does not: with cancels it
      // can only check that the servers counted at least what the completed requests reported.
      const SpecMatch match =
          summary["cancelled"].get<int>() > 0 ? SpecMatch::kServersAtLeast : SpecMatch::kExact;
      const std::vector<std::string> mismatches = CompareWithSummary(summary, delta, match);
      check["comparison"] = match == SpecMatch::kExact ? "exact" : "servers_at_least";
      check["servers"] = ToJson(delta);
      check["mismatches"] = mismatches;
      check["ok"] = mismatches.empty();
    }
    outcome.metrics_check_passed = check["ok"].get<bool>();
    summary["metrics_check"] = check;
  }

  if (!c.requests_jsonl.empty()) {
    RETURN_IF_ERROR(WriteFile(c.requests_jsonl, RequestsJsonl(run.requests, run.prompts)));
  }
  if (!c.record_tokens.empty()) {
    RETURN_IF_ERROR(WriteFile(c.record_tokens, TokenRecordsJsonl(run.prompts, run.requests)));
  }
  if (!c.result_json.empty()) RETURN_IF_ERROR(WriteFile(c.result_json, summary.dump(2) + "\n"));
  if (!c.result_csv.empty()) RETURN_IF_ERROR(WriteFile(c.result_csv, SummaryCsv(summary)));
  std::fputs(SummaryReport(summary, c.percentiles).c_str(), stdout);
  std::fputs(WorkloadReport(summary).c_str(), stdout);
  std::fflush(stdout);
  return outcome;
}

}  // namespace treespec::loadgen
