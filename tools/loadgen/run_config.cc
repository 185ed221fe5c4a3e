#include "tools/loadgen/run_config.h"

#include <cmath>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/loadgen/http_get.h"

namespace treespec::loadgen {
namespace {

absl::Status Invalid(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

// Items of a list separated by commas and/or blanks.
std::vector<absl::string_view> Items(absl::string_view spec) {
  return absl::StrSplit(spec, absl::ByAnyChar(", \t"), absl::SkipEmpty());
}

std::string ArrivalName(ArrivalProcess process) {
  switch (process) {
    case ArrivalProcess::kPoisson:
      return "poisson";
    case ArrivalProcess::kGamma:
      return "gamma";
    case ArrivalProcess::kConstant:
      return "constant";
  }
  return "?";
}

// A JSON number, or "inf" (JSON has no infinity).
nlohmann::json Rate(double rate) {
  return std::isinf(rate) ? nlohmann::json("inf") : nlohmann::json(rate);
}

}  // namespace

absl::StatusOr<Slo> ParseGoodput(absl::string_view spec) {
  Slo slo;
  for (absl::string_view item : Items(spec)) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !std::isfinite(ms) || ms < 0) {
      return Invalid("goodput", absl::StrCat("'", item,
                                             "': expected KEY:MILLISECONDS with KEY one of ttft, "
                                             "tpot, e2el and a number >= 0"));
    }
    std::optional<double>* field = kv[0] == "ttft"   ? &slo.ttft_ms
                                   : kv[0] == "tpot" ? &slo.tpot_ms
                                   : kv[0] == "e2el" ? &slo.e2el_ms
                                                     : nullptr;
    if (field == nullptr) {
      return Invalid("goodput",
                     absl::StrCat("'", item, "': unknown metric '", kv[0], "' (ttft, tpot, e2el)"));
    }
    if (field->has_value()) {
      return Invalid("goodput", absl::StrCat("'", kv[0], "' given twice"));
    }
    *field = ms;
  }
  return slo;
}

absl::StatusOr<std::vector<double>> ParsePercentiles(absl::string_view spec) {
  std::vector<double> out;
  for (absl::string_view item : Items(spec)) {
    double p = 0;
    if (!absl::SimpleAtod(item, &p) || !(p >= 0 && p <= 100)) {
      return Invalid("percentiles", absl::StrCat("'", item, "' is not a number in [0, 100]"));
    }
    out.push_back(p);
  }
  if (out.empty()) return Invalid("percentiles", "empty (e.g. 99 or 50,90,99)");
  return out;
}

absl::StatusOr<v1::SpeculationMode> ParseSpeculationMode(absl::string_view name) {
  v1::SpeculationMode mode;
  if (name.empty() ||
      !absl::c_all_of(name, [](char c) { return absl::ascii_islower(c) || c == '_'; }) ||
      !v1::SpeculationMode_Parse(absl::StrCat("SPECULATION_MODE_", absl::AsciiStrToUpper(name)),
                                 &mode)) {
    return Invalid(
        "mode",
        absl::StrCat("'", name, "': expected auto, off, ngram, draft_model, dflash or replay"));
  }
  return mode;
}

absl::StatusOr<WorkloadKind> ParseWorkloadKind(absl::string_view name) {
  if (name == "requests") return WorkloadKind::kRequests;
  if (name == "conversation") return WorkloadKind::kConversation;
  if (name == "mixed") return WorkloadKind::kMixed;
  return Invalid("workload",
                 absl::StrCat("'", name, "': expected requests, conversation or mixed"));
}

absl::StatusOr<DatasetKind> ParseDatasetKind(absl::string_view name,
                                             absl::string_view dataset_path) {
  if (name == "random") return DatasetKind::kRandom;
  if (name == "jsonl") return DatasetKind::kJsonl;
  if (name.empty()) return dataset_path.empty() ? DatasetKind::kRandom : DatasetKind::kJsonl;
  return Invalid("dataset_name", absl::StrCat("'", name, "': expected random or jsonl"));
}

absl::Status ValidateRunConfig(const RunConfig& c) {
  if (c.targets.empty()) return Invalid("target", "give one or more verifier addresses");
  for (const std::string& t : c.targets) {
    if (t.empty()) return Invalid("target", "an empty address in the list");
  }
  if (c.num_prompts < 1)
    return Invalid("num_prompts", absl::StrCat(c.num_prompts, ": must be >= 1"));
  if (c.num_warmups < 0) {
    return Invalid("num_warmups", absl::StrCat(c.num_warmups, ": must be >= 0"));
  }
  if (!(c.request_rate > 0)) {
    return Invalid("request_rate",
                   absl::StrCat(c.request_rate, ": must be > 0 requests/s (or inf: all at once)"));
  }
  if (!(c.burstiness > 0) || !std::isfinite(c.burstiness)) {
    return Invalid("burstiness", absl::StrCat(c.burstiness, ": must be finite and > 0"));
  }
  if (c.max_concurrency < 0) {
    return Invalid("max_concurrency", absl::StrCat(c.max_concurrency, ": must be >= 0 (0: none)"));
  }
  if (!(c.duration_s >= 0) || !std::isfinite(c.duration_s)) {
    return Invalid("duration_s", absl::StrCat(c.duration_s, ": must be >= 0 (0: no bound)"));
  }
  if (!(c.request_timeout_s > 0) || !std::isfinite(c.request_timeout_s)) {
    return Invalid("request_timeout_s", absl::StrCat(c.request_timeout_s, ": must be > 0"));
  }
  if (!(c.connect_timeout_s > 0) || !std::isfinite(c.connect_timeout_s)) {
    return Invalid("connect_timeout_s", absl::StrCat(c.connect_timeout_s, ": must be > 0"));
  }
  if (!(c.cancel_fraction >= 0 && c.cancel_fraction <= 1)) {
    return Invalid("cancel_fraction", absl::StrCat(c.cancel_fraction, ": must be in [0, 1]"));
  }
  if (!(c.cancel_delay_ms >= 0) || !std::isfinite(c.cancel_delay_ms)) {
    return Invalid("cancel_delay_ms", absl::StrCat(c.cancel_delay_ms, ": must be finite and >= 0"));
  }
  switch (c.dataset) {
    case DatasetKind::kRandom:
      if (!c.dataset_path.empty()) {
        return Invalid("dataset_path", "set with --dataset_name=random; drop one of them");
      }
      if (c.random_input_len < 1) {
        return Invalid("random_input_len", absl::StrCat(c.random_input_len, ": must be >= 1"));
      }
      if (c.random_output_len < 1) {
        return Invalid("random_output_len", absl::StrCat(c.random_output_len, ": must be >= 1"));
      }
      if (!(c.random_range_ratio >= 0 && c.random_range_ratio < 1)) {
        return Invalid("random_range_ratio",
                       absl::StrCat(c.random_range_ratio, ": must be in [0, 1)"));
      }
      if (c.random_vocab_size < 0) {
        return Invalid("random_vocab_size",
                       absl::StrCat(c.random_vocab_size, ": must be >= 0 (0: the server's)"));
      }
      break;
    case DatasetKind::kJsonl:
      if (c.dataset_path.empty()) return Invalid("dataset_path", "required for a JSONL dataset");
      if (!c.record_tokens.empty()) {
        return Invalid("record_tokens",
                       "records token-id prompts only: use --dataset_name=random (a JSONL "
                       "dataset's text is tokenized by the server)");
      }
      if (c.jsonl_output_len < 1) {
        return Invalid("jsonl_output_len", absl::StrCat(c.jsonl_output_len, ": must be >= 1"));
      }
      break;
  }
  auto at_least_1 = [](absl::string_view flag, int value) {
    return value >= 1 ? absl::OkStatus() : Invalid(flag, absl::StrCat(value, ": must be >= 1"));
  };
  if (c.workload == WorkloadKind::kConversation) {
    if (c.dataset != DatasetKind::kRandom) {
      return Invalid("workload", "conversation sends token-id turns: drop --dataset_path");
    }
    for (const auto& [flag, value] : {std::pair{"conversations", c.conversations},
                                      {"turns", c.turns},
                                      {"history_len", c.history_len},
                                      {"turn_input_len", c.turn_input_len}}) {
      if (absl::Status s = at_least_1(flag, value); !s.ok()) return s;
    }
    if (!(c.think_time_ms >= 0) || !std::isfinite(c.think_time_ms)) {
      return Invalid("think_time_ms", absl::StrCat(c.think_time_ms, ": must be finite and >= 0"));
    }
  }
  if (c.workload == WorkloadKind::kMixed) {
    for (const auto& [flag, value] : {std::pair{"streams", c.streams},
                                      {"stream_input_len", c.stream_input_len},
                                      {"stream_output_len", c.stream_output_len}}) {
      if (absl::Status s = at_least_1(flag, value); !s.ok()) return s;
    }
  }
  const RequestOptions& r = c.request;
  if (r.tree_budget < 0) return Invalid("tree_budget", "must be >= 0 (0: server default)");
  if (r.max_depth < 0) return Invalid("max_depth", "must be >= 0 (0: server default)");
  if (!(r.temperature >= 0) || !std::isfinite(r.temperature)) {
    return Invalid("temperature", absl::StrCat(r.temperature, ": must be >= 0"));
  }
  if (!(r.top_p >= 0 && r.top_p <= 1)) {
    return Invalid("top_p", absl::StrCat(r.top_p, ": must be in (0, 1], or 0 for unset"));
  }
  if (r.top_k < 0) return Invalid("top_k", absl::StrCat(r.top_k, ": must be >= 0"));
  for (const std::string& url : c.metrics_urls) {
    if (absl::Status s = ParseHttpUrl(url).status(); !s.ok()) {
      return Invalid("metrics_urls", s.message());
    }
  }
  if (c.check_metrics && c.metrics_urls.empty()) {
    return Invalid("check_metrics", "needs --metrics_urls (the verifiers' /metrics addresses)");
  }
  return absl::OkStatus();
}

nlohmann::json ToJson(const RunConfig& c) {
  nlohmann::json j;
  j["targets"] = c.targets;
  j["dataset_name"] = c.dataset == DatasetKind::kRandom ? "random" : "jsonl";
  if (c.dataset == DatasetKind::kRandom) {
    j["random_input_len"] = c.random_input_len;
    j["random_output_len"] = c.random_output_len;
    j["random_range_ratio"] = c.random_range_ratio;
    j["random_vocab_size"] = c.random_vocab_size;
  } else {
    j["dataset_path"] = c.dataset_path;
    j["jsonl_output_len"] = c.jsonl_output_len;
  }
  switch (c.workload) {
    case WorkloadKind::kRequests:
      j["workload"] = "requests";
      break;
    case WorkloadKind::kConversation:
      j["workload"] = "conversation";
      j["conversations"] = c.conversations;
      j["turns"] = c.turns;
      j["history_len"] = c.history_len;
      j["turn_input_len"] = c.turn_input_len;
      j["think_time_ms"] = c.think_time_ms;
      break;
    case WorkloadKind::kMixed:
      j["workload"] = "mixed";
      j["streams"] = c.streams;
      j["stream_input_len"] = c.stream_input_len;
      j["stream_output_len"] = c.stream_output_len;
      break;
  }
  const std::string mode = v1::SpeculationMode_Name(c.request.mode);
  j["mode"] = absl::AsciiStrToLower(absl::StripPrefix(mode, "SPECULATION_MODE_"));
  j["tree_budget"] = c.request.tree_budget;
  j["max_depth"] = c.request.max_depth;
  j["temperature"] = c.request.temperature;
  j["top_p"] = c.request.top_p;
  j["top_k"] = c.request.top_k;
  j["ignore_eos"] = c.request.ignore_eos;
  j["num_prompts"] = c.num_prompts;
  j["num_warmups"] = c.num_warmups;
  j["request_rate"] = Rate(c.request_rate);
  j["arrival"] = ArrivalName(c.arrival);
  j["burstiness"] = c.burstiness;
  j["seed"] = c.seed;
  j["max_concurrency"] = c.max_concurrency;
  j["duration_s"] = c.duration_s;
  j["request_timeout_s"] = c.request_timeout_s;
  j["connect_timeout_s"] = c.connect_timeout_s;
  j["failover"] = c.failover;
  j["cancel_fraction"] = c.cancel_fraction;
  j["cancel_delay_ms"] = c.cancel_delay_ms;
  j["percentiles"] = c.percentiles;
  nlohmann::json goodput = nlohmann::json::object();
  if (c.slo.ttft_ms) goodput["ttft"] = *c.slo.ttft_ms;
  if (c.slo.tpot_ms) goodput["tpot"] = *c.slo.tpot_ms;
  if (c.slo.e2el_ms) goodput["e2el"] = *c.slo.e2el_ms;
  j["goodput"] = goodput;
  j["metrics_urls"] = c.metrics_urls;
  return j;
}

}  // namespace treespec::loadgen
