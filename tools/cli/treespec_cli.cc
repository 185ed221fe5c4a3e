// treespec-cli: the project's client for the public Generation API.
//
//   treespec-cli info --target=127.0.0.1:50051
//   treespec-cli generate --target=... --prompt="def fib(n):" --max_new_tokens=64
//   treespec-cli generate --prompt_ids=1,2,3 --print_ids
//   treespec-cli generate --prompts_file=tests/data/heldout_prompts.jsonl --concurrency=4
//
// One prompt streams its text as it arrives; a prompts file prints each completion and a
// summary (tokens/s, mean acceptance length, acceptance per depth), optionally as JSON.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/bearer_auth.h"
#include "common/rpc/grpc_shutdown.h"
#include "common/rpc/tls.h"
#include "treespec/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "verifier address");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA that signed the verifier's certificate: use TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS, with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the bearer token every call sends (verifiers run with "
          "--auth_token_file); empty = none");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids");
ABSL_FLAG(std::string, prompts_file, "", "JSONL file of {\"text\": ...} prompts");
ABSL_FLAG(int, limit, 0, "use only the first N prompts of --prompts_file (0 = all)");
ABSL_FLAG(int, concurrency, 1, "prompts in flight at once (--prompts_file)");
ABSL_FLAG(int, max_new_tokens, 0, "tokens to generate (0 = server default)");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(double, top_p, 0.0, "nucleus mass in (0, 1] (0 = unset)");
ABSL_FLAG(int, top_k, 0, "0 = no limit");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings (comma-separated)");
ABSL_FLAG(std::string, stop_ids, "", "stop token ids (comma-separated)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(std::string, mode, "auto", "speculation: auto|off|ngram|draft_model|dflash|replay");
ABSL_FLAG(int, tree_budget, 0, "drafted nodes per step (0 = server default)");
ABSL_FLAG(int, max_depth, 0, "deepest drafted node (0 = server default)");
ABSL_FLAG(bool, add_bos, false, "prepend BOS to a text prompt");
ABSL_FLAG(bool, print_ids, false, "print generated token ids");
ABSL_FLAG(bool, quiet, false, "print only the summary (--prompts_file)");
ABSL_FLAG(std::string, json_out, "", "write the summary (and per-request results) as JSON");
ABSL_FLAG(double, timeout_s, 600, "per-request deadline");

namespace v1 = treespec::v1;

namespace {

struct Result {
  std::string text;
  std::vector<int32_t> ids;
  v1::GenerateResponse last;
  grpc::Status status;
  double wall_ms = 0;
  double ttft_ms = 0;
};

// "INVALID_ARGUMENT" etc.: gRPC and Abseil share the canonical code numbers.
std::string StatusCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

bool ParseIds(const std::string& csv, std::vector<int32_t>* out) {
  for (absl::string_view part : absl::StrSplit(csv, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(part, &v)) return false;
    out->push_back(v);
  }
  return true;
}

v1::SpeculationMode ParseMode(const std::string& m, bool* ok) {
  *ok = true;
  if (m == "auto") return v1::SPECULATION_MODE_AUTO;
  if (m == "off") return v1::SPECULATION_MODE_OFF;
  if (m == "ngram") return v1::SPECULATION_MODE_NGRAM;
  if (m == "draft_model") return v1::SPECULATION_MODE_DRAFT_MODEL;
  if (m == "dflash") return v1::SPECULATION_MODE_DFLASH;
  if (m == "replay") return v1::SPECULATION_MODE_REPLAY;
  *ok = false;
  return v1::SPECULATION_MODE_AUTO;
}

// Fills everything but the prompt from the flags.
v1::GenerateRequest BaseRequest(v1::SpeculationMode mode) {
  v1::GenerateRequest r;
  r.set_return_text(true);
  r.set_add_bos(absl::GetFlag(FLAGS_add_bos));
  v1::SamplingParams* s = r.mutable_sampling();
  if (absl::GetFlag(FLAGS_max_new_tokens) != 0)
    s->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_p) != 0) s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_seed(absl::GetFlag(FLAGS_seed));
  s->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) s->add_stop_strings(stop);
  std::vector<int32_t> stop_ids;
  ParseIds(absl::GetFlag(FLAGS_stop_ids), &stop_ids);
  for (int32_t id : stop_ids) s->add_stop_token_ids(id);
  v1::SpeculationParams* spec = r.mutable_speculation();
  spec->set_mode(mode);
  if (absl::GetFlag(FLAGS_tree_budget) != 0)
    spec->set_tree_budget(absl::GetFlag(FLAGS_tree_budget));
  if (absl::GetFlag(FLAGS_max_depth) != 0) spec->set_max_depth(absl::GetFlag(FLAGS_max_depth));
  return r;
}

// A verifier and the bearer token its calls carry ("" = none).
struct Verifier {
  v1::Generation::Stub* stub;
  std::string token;
};

// Runs one streaming call; `on_delta` sees each text delta as it arrives.
Result RunOne(const Verifier& verifier, const v1::GenerateRequest& request,
              const std::function<void(const std::string&)>& on_delta) {
  Result result;
  grpc::ClientContext ctx;
  treespec::AddBearerToken(verifier.token, &ctx);
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1e3)));
  const absl::Time start = absl::Now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      verifier.stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  bool first = true;
  while (reader->Read(&response)) {
    if (first && response.token_ids_size() > 0) {
      result.ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      first = false;
    }
    result.text += response.text();
    result.ids.insert(result.ids.end(), response.token_ids().begin(), response.token_ids().end());
    if (on_delta && !response.text().empty()) on_delta(response.text());
    result.last = response;
  }
  result.status = reader->Finish();
  result.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  return result;
}

std::string StatsLine(const v1::GenerateResponse& last, double wall_ms) {
  const v1::SpeculationStats& s = last.speculation();
  const int completion = last.usage().completion_tokens();
  std::string line = absl::StrFormat(
      "[%d prompt (%d cached) + %d new tokens, %.1f ms, %.1f tok/s, "
      "finish %s",
      last.usage().prompt_tokens(), last.usage().cached_tokens(), completion, wall_ms,
      wall_ms > 0 ? completion * 1e3 / wall_ms : 0.0, v1::FinishReason_Name(last.finish_reason()));
  if (s.steps() > 0) {
    std::vector<std::string> per_depth;
    for (int64_t a : s.accepted_per_depth()) {
      per_depth.push_back(absl::StrFormat("%.2f", static_cast<double>(a) / s.steps()));
    }
    line += absl::StrFormat(", %d steps, mean acceptance %.2f, acceptance per depth [%s]",
                            s.steps(), s.mean_acceptance_length(), absl::StrJoin(per_depth, " "));
  }
  if (s.forward_ms() > 0) {
    line += absl::StrFormat(", step time: draft wait %.1f ms, forward %.1f ms, host %.1f ms",
                            s.draft_wait_ms(), s.forward_ms(), s.host_ms());
  }
  return line + "]";
}

int Info(const Verifier& verifier) {
  grpc::ClientContext ctx;
  treespec::AddBearerToken(verifier.token, &ctx);
  v1::ModelInfo info;
  grpc::Status status = verifier.stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    std::cerr << "error: " << status.error_code() << " " << status.error_message() << "\n";
    return 1;
  }
  std::cout << info.DebugString();
  return 0;
}

std::vector<std::string> ReadPrompts(const std::string& path, int limit) {
  std::vector<std::string> prompts;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("text") || !j["text"].is_string()) {
      std::cerr << path << ": skipping a line without a \"text\" string\n";
      continue;
    }
    prompts.push_back(j["text"].get<std::string>());
    if (limit > 0 && static_cast<int>(prompts.size()) >= limit) break;
  }
  return prompts;
}

int GenerateMany(const Verifier& verifier, v1::SpeculationMode mode) {
  const std::vector<std::string> prompts =
      ReadPrompts(absl::GetFlag(FLAGS_prompts_file), absl::GetFlag(FLAGS_limit));
  if (prompts.empty()) {
    std::cerr << "error: no prompts in " << absl::GetFlag(FLAGS_prompts_file) << "\n";
    return 2;
  }
  std::vector<Result> results(prompts.size());
  std::mutex mu;
  size_t next = 0;
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::max(1, absl::GetFlag(FLAGS_concurrency)); ++w) {
    workers.emplace_back([&] {
      while (true) {
        size_t i;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (next >= prompts.size()) return;
          i = next++;
        }
        v1::GenerateRequest request = BaseRequest(mode);
        request.set_text(prompts[i]);
        results[i] = RunOne(verifier, request, nullptr);
      }
    });
  }
  for (auto& t : workers) t.join();
  const double wall_ms = absl::ToDoubleMilliseconds(absl::Now() - start);

  int64_t tokens = 0, steps = 0, accepted = 0, drafted = 0, failures = 0;
  double wait_ms = 0, forward_ms = 0, host_ms = 0;
  std::vector<int64_t> per_depth;
  nlohmann::json requests = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    if (!r.status.ok()) {
      ++failures;
      std::cerr << "prompt " << i << ": error " << StatusCodeName(r.status.error_code()) << ": "
                << r.status.error_message() << "\n";
      continue;
    }
    const v1::SpeculationStats& s = r.last.speculation();
    tokens += r.last.usage().completion_tokens();
    steps += s.steps();
    accepted += s.accepted_tokens();
    drafted += s.drafted_tokens();
    wait_ms += s.draft_wait_ms();
    forward_ms += s.forward_ms();
    host_ms += s.host_ms();
    if (per_depth.size() < static_cast<size_t>(s.accepted_per_depth_size())) {
      per_depth.resize(s.accepted_per_depth_size());
    }
    for (int d = 0; d < s.accepted_per_depth_size(); ++d) per_depth[d] += s.accepted_per_depth(d);
    if (!absl::GetFlag(FLAGS_quiet)) {
      std::cout << "=== prompt " << i << " " << StatsLine(r.last, r.wall_ms) << "\n"
                << prompts[i] << "\033[1m" << r.text << "\033[0m\n";
    }
    requests.push_back({{"prompt_index", i},
                        {"completion_tokens", r.last.usage().completion_tokens()},
                        {"cached_tokens", r.last.usage().cached_tokens()},
                        {"wall_ms", r.wall_ms},
                        {"ttft_ms", r.ttft_ms},
                        {"steps", s.steps()},
                        {"accepted_tokens", s.accepted_tokens()},
                        {"text", r.text},
                        {"token_ids", r.ids}});
  }
  std::vector<double> depth_rates;
  for (int64_t a : per_depth) depth_rates.push_back(steps > 0 ? static_cast<double>(a) / steps : 0);
  const double mal = steps > 0 ? 1.0 + static_cast<double>(accepted) / steps : 0.0;
  std::printf(
      "summary: %zu prompts, %lld failed, %lld new tokens in %.1f ms = %.1f tok/s; "
      "%lld verify steps, %lld drafted, %lld accepted, mean acceptance length %.2f; "
      "acceptance per depth [%s]; verifier step time: draft wait %.0f ms, forward %.0f ms, "
      "host %.0f ms\n",
      prompts.size(), static_cast<long long>(failures), static_cast<long long>(tokens), wall_ms,
      wall_ms > 0 ? tokens * 1e3 / wall_ms : 0.0, static_cast<long long>(steps),
      static_cast<long long>(drafted), static_cast<long long>(accepted), mal,
      absl::StrJoin(
          depth_rates, " ",
          [](std::string* out, double v) { absl::StrAppend(out, absl::StrFormat("%.2f", v)); })
          .c_str(),
      wait_ms, forward_ms, host_ms);
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    nlohmann::json summary = {{"prompts", prompts.size()},
                              {"failed", failures},
                              {"completion_tokens", tokens},
                              {"wall_ms", wall_ms},
                              {"tokens_per_s", wall_ms > 0 ? tokens * 1e3 / wall_ms : 0.0},
                              {"steps", steps},
                              {"drafted_tokens", drafted},
                              {"accepted_tokens", accepted},
                              {"mean_acceptance_length", mal},
                              {"acceptance_per_depth", depth_rates},
                              {"draft_wait_ms", wait_ms},
                              {"forward_ms", forward_ms},
                              {"host_ms", host_ms},
                              {"concurrency", absl::GetFlag(FLAGS_concurrency)},
                              {"mode", absl::GetFlag(FLAGS_mode)},
                              {"requests", requests}};
    std::ofstream(absl::GetFlag(FLAGS_json_out)) << summary.dump(1) << "\n";
  }
  return failures == 0 ? 0 : 1;
}

int GenerateOne(const Verifier& verifier, v1::SpeculationMode mode) {
  v1::GenerateRequest request = BaseRequest(mode);
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    std::vector<int32_t> ids;
    if (!ParseIds(absl::GetFlag(FLAGS_prompt_ids), &ids)) {
      std::cerr << "error: --prompt_ids must be comma-separated integers\n";
      return 2;
    }
    request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  } else {
    request.set_text(absl::GetFlag(FLAGS_prompt));
  }
  Result r =
      RunOne(verifier, request, [](const std::string& delta) { std::cout << delta << std::flush; });
  std::cout << "\n";
  if (!r.status.ok()) {
    std::cerr << "error: " << StatusCodeName(r.status.error_code()) << ": "
              << r.status.error_message() << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_print_ids)) {
    std::cout << "ids: " << absl::StrJoin(r.ids, ",") << "\n";
  }
  std::cerr << StatsLine(r.last, r.wall_ms) << "\n";
  return 0;
}

// Every gRPC object lives in here: main waits for gRPC's shutdown after it returns.
int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("treespec-cli info|generate [--flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: treespec-cli info|generate [--flags]  (--help for flags)\n";
    return 2;
  }
  const std::string command = args[1];
  auto credentials = treespec::MakeChannelCredentials({.cert = absl::GetFlag(FLAGS_tls_cert),
                                                       .key = absl::GetFlag(FLAGS_tls_key),
                                                       .ca = absl::GetFlag(FLAGS_tls_ca)});
  if (!credentials.ok()) {
    std::cerr << credentials.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::string> token =
      treespec::LoadClientBearerToken(absl::GetFlag(FLAGS_auth_token_file), "--auth_token_file");
  if (!token.ok()) {
    std::cerr << token.status().message() << "\n";
    return 2;
  }
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_target), *credentials);
  auto stub = v1::Generation::NewStub(channel);
  const Verifier verifier{stub.get(), *std::move(token)};
  if (command == "info") return Info(verifier);
  if (command != "generate") {
    std::cerr << "unknown command '" << command << "': use info or generate\n";
    return 2;
  }
  bool mode_ok;
  const v1::SpeculationMode mode = ParseMode(absl::GetFlag(FLAGS_mode), &mode_ok);
  if (!mode_ok) {
    std::cerr << "error: --mode must be auto, off, ngram, draft_model, dflash or replay\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_prompts_file).empty()) return GenerateMany(verifier, mode);
  return GenerateOne(verifier, mode);
}

}  // namespace

int main(int argc, char** argv) { return treespec::AfterGrpcShutdown(Main(argc, argv)); }
