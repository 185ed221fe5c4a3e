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
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/driver.h"
#include "tools/loadgen/output.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/spec_counters.h"

namespace treespec::loadgen {
namespace {

constexpr size_t kMaxErrorKinds = 10;

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

// Warm-up requests (the dataset's first prompts, all sent at once under the concurrency bound);
// any failure is an error: the servers are not ready for a measurement.
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
  if (c.dataset == DatasetKind::kRandom) {
    ASSIGN_OR_RETURN(prompts, MakeRandomDataset(c, model));
  }
  ASSIGN_OR_RETURN(const std::vector<double> send_times, ArrivalTimes({.process = c.arrival,
                                                                       .rate = c.request_rate,
                                                                       .burstiness = c.burstiness,
                                                                       .seed = c.seed},
                                                                      c.num_prompts));
  const ScheduleOptions schedule = {.max_concurrency = c.max_concurrency,
                                    .duration_s = c.duration_s,
                                    .request_timeout_s = c.request_timeout_s,
                                    .failover = c.failover};
  if (c.num_warmups > 0) {
    ScheduleOptions warm_schedule = schedule;
    warm_schedule.duration_s = 0;
    RETURN_IF_ERROR(WarmUp(driver, c, prompts, warm_schedule));
  }

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
  for (const Prompt& p : prompts) output_lens.push_back(p.output_len);
  const std::vector<CancelPoint> cancels = PlanCancels(
      {.fraction = c.cancel_fraction, .max_delay_ms = c.cancel_delay_ms, .seed = c.seed},
      output_lens);
  const absl::Time started = absl::Now();
  RunResult run;
  {
    ProgressBar bar("requests", c.num_prompts, c.progress);
    run = driver.Run(prompts, send_times, cancels, c.request, schedule, &bar);
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
    RETURN_IF_ERROR(WriteFile(c.requests_jsonl, RequestsJsonl(run.requests)));
  }
  if (!c.record_tokens.empty()) {
    RETURN_IF_ERROR(WriteFile(c.record_tokens, TokenRecordsJsonl(prompts, run.requests)));
  }
  if (!c.result_json.empty()) RETURN_IF_ERROR(WriteFile(c.result_json, summary.dump(2) + "\n"));
  if (!c.result_csv.empty()) RETURN_IF_ERROR(WriteFile(c.result_csv, SummaryCsv(summary)));
  std::fputs(SummaryReport(summary, c.percentiles).c_str(), stdout);
  std::fflush(stdout);
  return outcome;
}

}  // namespace treespec::loadgen
