// Fuzzes a client's GenerateRequest the way the verifier's Generate reactor takes it: proto
// bytes -> ParseFromArray -> FromProto (tokenizing text) -> Engine::Validate, against the
// embedded tiny target (its config, tokenizer and a small KV pool). A request that passes must
// have every field the engine relies on filled and in range, and its stop conditions must then
// behave: an OutputProcessor fed tokens streams valid UTF-8 that never contains a stop string,
// stops by max_new_tokens at the latest, and streams exactly the decoded text (up to the stop).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/causal_lm.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_util.h"
#include "treespec/v1/generation.pb.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/engine.h"
#include "verifier_service/output_processor.h"
#include "verifier_service/proto_conversion.h"

namespace treespec {
namespace {

// Engine::Validate only asks whether a drafter exists; no session is ever opened here.
class NoDraftSource final : public DraftSource {
 public:
  std::unique_ptr<DraftStream> Open(const DraftOpenParams&, std::function<void()>) override {
    fuzz::Fail(__FILE__, __LINE__, "Open", "the fuzzer never submits a request");
  }
  std::string target() const override { return "none"; }
};

struct Server {
  std::unique_ptr<CausalLm> model;
  std::unique_ptr<Tokenizer> tokenizer;
  NoDraftSource drafts;
  std::unique_ptr<Engine> engine;
};

// Built once: the engine's thread idles, and the process exits without tearing it down.
const Server& TheServer() {
  static const Server* const server = [] {
    const std::string dir = TREESPEC_SOURCE_DIR "/models/tiny-target";
    // Invalid UTF-8 in a string field fails the parse, as it should; the log line it also
    // writes would flood the fuzzer's output.
    google::protobuf::SetLogHandler(nullptr);
    auto* s = new Server;
    LmOptions lm;
    lm.kv_pages = 64;  // 1024 slots: less than a full context, so admission limits are reached
    absl::StatusOr<std::unique_ptr<CausalLm>> model = LoadCpuCausalLm(dir, lm);
    FUZZ_CHECK(model.ok(), std::string(model.status().message()));
    s->model = *std::move(model);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir + "/tokenizer.json");
    FUZZ_CHECK(tokenizer.ok(), std::string(tokenizer.status().message()));
    s->tokenizer = *std::move(tokenizer);
    EngineOptions options;
    options.max_new_tokens_limit = 900;  // below the context length, so it is reached too
    s->engine = std::make_unique<Engine>(s->model.get(), s->tokenizer.get(), &s->drafts, options);
    return s;
  }();
  return *server;
}

void CheckValidated(const Server& server, const GenerationRequest& r) {
  const Engine& engine = *server.engine;
  const EngineOptions& o = engine.options();
  const int vocab = server.model->config().vocab_size;
  const int context = engine.context_length();
  const int prompt_len = static_cast<int>(r.prompt.size());
  FUZZ_CHECK(prompt_len > 0 && prompt_len < context, absl::StrCat(prompt_len));
  // The bytes fields a client may fill with anything: valid UTF-8 once admitted.
  FUZZ_CHECK(r.id.size() <= kMaxRequestIdBytes && utf8::FindInvalid(r.id) == std::string::npos,
             "request_id");
  for (const std::string& stop : r.stop_strings) {
    FUZZ_CHECK(utf8::FindInvalid(stop) == std::string::npos, "stop string not UTF-8");
  }
  for (int32_t id : r.prompt) FUZZ_CHECK(id >= 0 && id < vocab, absl::StrCat("prompt id ", id));
  FUZZ_CHECK(r.max_new_tokens.has_value() && *r.max_new_tokens > 0 &&
                 *r.max_new_tokens <= context - prompt_len &&
                 *r.max_new_tokens <= engine.max_new_tokens_limit(),
             absl::StrCat("max_new_tokens ", r.max_new_tokens.value_or(-1)));
  FUZZ_CHECK(r.top_p.has_value() && *r.top_p > 0 && *r.top_p <= 1 && r.sampling.top_p == *r.top_p,
             absl::StrCat("top_p ", r.top_p.value_or(-1)));
  FUZZ_CHECK(std::isfinite(r.sampling.temperature) && r.sampling.temperature >= 0,
             absl::StrCat("temperature ", r.sampling.temperature));
  FUZZ_CHECK(r.sampling.top_k >= 0, absl::StrCat("top_k ", r.sampling.top_k));
  FUZZ_CHECK(r.stop_token_ids.size() <= kMaxStopTokenIds, "stop ids");
  for (int32_t id : r.stop_token_ids) FUZZ_CHECK(id >= 0 && id < vocab, absl::StrCat(id));
  FUZZ_CHECK(r.stop_strings.size() <= kMaxStopStrings, "stop strings");
  for (const std::string& s : r.stop_strings) {
    FUZZ_CHECK(!s.empty() && s.size() <= kMaxStopStringBytes, s);
  }
  FUZZ_CHECK(r.spec.tree_budget >= 1 && r.spec.tree_budget <= o.spec.max.tree_budget,
             absl::StrCat("tree_budget ", r.spec.tree_budget));
  FUZZ_CHECK(r.spec.max_depth >= 1 && r.spec.max_depth <= o.spec.max.max_depth,
             absl::StrCat("max_depth ", r.spec.max_depth));
  // Admission promises the worst case: prompt + output + one tree.
  const PagedKvCache& cache = server.model->kv_cache();
  const int64_t slots = int64_t{prompt_len} + *r.max_new_tokens + r.spec.tree_budget + 1;
  FUZZ_CHECK((slots + cache.page_size() - 1) / cache.page_size() <= cache.num_pages(),
             absl::StrCat(slots, " slots"));
}

// Streams the prompt's tokens, then each stop string's, as if the model had emitted them.
void CheckOutput(const Server& server, const GenerationRequest& r) {
  const Tokenizer& tokenizer = *server.tokenizer;
  std::vector<int32_t> emitted(r.prompt.begin(), r.prompt.end());
  for (const std::string& stop : r.stop_strings) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(stop);
    if (ids.ok()) emitted.insert(emitted.end(), ids->begin(), ids->end());
  }
  emitted.resize(std::min<size_t>(emitted.size(), 256));
  const std::vector<int>& eos = server.model->config().eos_token_ids;
  OutputProcessor output(r, &tokenizer, std::vector<int32_t>(eos.begin(), eos.end()));
  std::string text;
  GenerationUpdate last;
  size_t fed = 0;
  for (size_t chunk = 1; fed < emitted.size() && !output.finished(); chunk = chunk % 4 + 1) {
    const size_t n = std::min(chunk, emitted.size() - fed);
    last = output.Append(absl::MakeConstSpan(emitted).subspan(fed, n));
    fed += n;
    FUZZ_CHECK(utf8::FindInvalid(last.text) == std::string_view::npos, "invalid UTF-8 streamed");
    text += last.text;
  }
  if (!output.finished()) {
    last = output.Finish(FinishReason::kContext);
    FUZZ_CHECK(utf8::FindInvalid(last.text) == std::string_view::npos, "invalid UTF-8 streamed");
    text += last.text;
  }
  const int generated = output.completion_tokens();
  FUZZ_CHECK(generated <= *r.max_new_tokens, absl::StrCat(generated, " tokens"));
  if (!r.return_text) {
    FUZZ_CHECK(text.empty(), "text streamed without return_text");
    return;
  }
  for (const std::string& stop : r.stop_strings) {
    FUZZ_CHECK(text.find(stop) == std::string::npos, "streamed text holds stop string " + stop);
  }
  // EOS and stop ids end the output without their text.
  const FinishReason reason = output.finish_reason();
  const bool drop_last = reason == FinishReason::kEos || reason == FinishReason::kStopToken;
  absl::StatusOr<std::string> decoded =
      tokenizer.Decode(absl::MakeConstSpan(emitted).subspan(0, generated - (drop_last ? 1 : 0)));
  FUZZ_CHECK(decoded.ok(), std::string(decoded.status().message()));
  const std::string expected = utf8::ToValidLossy(*decoded);
  if (reason == FinishReason::kStopString) {
    FUZZ_CHECK(expected.compare(0, text.size(), text) == 0, "text is not a prefix of the output");
  } else {
    FUZZ_CHECK(text == expected, "text differs from the decoded output");
  }
}

void FuzzRequest(const uint8_t* data, size_t size) {
  const Server& server = TheServer();
  v1::GenerateRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<GenerationRequest> request =
      FromProto(proto, server.tokenizer.get(), server.model->config().bos_token_id,
                server.engine->context_length() - 1,
                proto.request_id().empty() ? "fuzz-request" : proto.request_id());
  if (!request.ok()) return;
  if (!server.engine->Validate(*request).ok()) return;
  CheckValidated(server, *request);
  CheckOutput(server, *request);
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  treespec::FuzzRequest(data, size);
  return 0;
}
