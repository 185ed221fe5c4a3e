#include "verifier_service/proto_conversion.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/draft_context_proto.h"
#include "common/rpc/drafter_kind_proto.h"
#include "common/tokenizer/utf8.h"

namespace treespec {

absl::StatusOr<GenerationRequest> FromProto(const v1::GenerateRequest& proto,
                                            const Tokenizer* tokenizer, int32_t bos_token_id,
                                            int max_prompt_tokens, std::string request_id) {
  GenerationRequest r;
  r.id = std::move(request_id);
  // Checked here, not left to the parser: a bad `string` field would fail the call before the
  // service sees it, with no message (the fields are bytes on the wire for that reason).
  if (const size_t at = utf8::FindInvalid(r.id); at != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is not valid UTF-8 (byte ", at, " of ", r.id.size(), ")"));
  }
  for (int i = 0; i < proto.sampling().stop_strings_size(); ++i) {
    const std::string& stop = proto.sampling().stop_strings(i);
    if (const size_t at = utf8::FindInvalid(stop); at != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop_strings[", i,
                                                     "] is not valid UTF-8 (byte ", at, " of ",
                                                     stop.size(), ")"));
    }
  }
  switch (proto.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (tokenizer == nullptr) {
        return absl::FailedPreconditionError(
            "this server has no tokenizer (no tokenizer.json in the model directory); send "
            "token_ids instead of text");
      }
      const bool bos = proto.add_bos() && bos_token_id >= 0;
      const size_t max_text_tokens = std::max(0, max_prompt_tokens - (bos ? 1 : 0));
      absl::StatusOr<std::vector<int32_t>> ids =
          tokenizer->EncodeAtMost(proto.text(), max_text_tokens);
      if (ids.status().code() == absl::StatusCode::kOutOfRange) {
        return absl::InvalidArgumentError(absl::StrCat(
            "text is longer than ", max_text_tokens, " tokens, but the context length is ",
            max_prompt_tokens + 1, " (a prompt of at most ", max_prompt_tokens,
            " tokens, BOS included); shorten it"));
      }
      if (!ids.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message()));
      }
      if (bos) r.prompt.push_back(bos_token_id);
      r.prompt.insert(r.prompt.end(), ids->begin(), ids->end());
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      r.prompt.assign(proto.token_ids().ids().begin(), proto.token_ids().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;  // empty prompt: Engine::Validate says so
  }
  const v1::SamplingParams& s = proto.sampling();
  if (s.has_max_new_tokens()) r.max_new_tokens = s.max_new_tokens();
  if (s.has_top_p()) r.top_p = s.top_p();
  r.sampling.temperature = s.temperature();
  r.sampling.top_k = s.top_k();
  r.sampling.seed = s.seed();
  r.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  r.stop_strings.assign(s.stop_strings().begin(), s.stop_strings().end());
  r.ignore_eos = s.ignore_eos();
  r.return_text = proto.return_text();

  const v1::SpeculationParams& spec = proto.speculation();
  if (spec.mode() == v1::SPECULATION_MODE_AUTO) {
    r.spec_mode = SpecMode::Auto();
  } else if (spec.mode() == v1::SPECULATION_MODE_OFF) {
    r.spec_mode = SpecMode::Off();
  } else if (const std::optional<DrafterKind> kind = DrafterKindFromProto(spec.mode())) {
    r.spec_mode = SpecMode::Of(*kind);  // whether a drafter serves it is the engine's question
  } else {
    std::string known = "AUTO (0), OFF (1)";
    for (const DrafterKindInfo& info : AllDrafterKinds()) {
      absl::StrAppend(&known, ", ", info.mode_name, " (", static_cast<int>(ToProto(info.kind)),
                      ")");
    }
    return absl::InvalidArgumentError(absl::StrCat("speculation.mode ",
                                                   static_cast<int>(spec.mode()),
                                                   " is not a known mode; use one of ", known));
  }
  r.spec.tree_budget = spec.tree_budget();  // absent reads 0: unset, as an explicit 0
  r.spec.max_depth = spec.max_depth();
  return r;
}

namespace {
v1::FinishReason ToProtoReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kContext:
      return v1::FINISH_REASON_CONTEXT;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}
}  // namespace

v1::SpeculationMode ToProtoMode(SpecMode mode) {
  if (mode.off()) return v1::SPECULATION_MODE_OFF;
  if (const std::optional<DrafterKind> kind = mode.kind()) return ToProto(*kind);
  return v1::SPECULATION_MODE_AUTO;
}

v1::GenerateResponse ToProto(const GenerationUpdate& update, const std::string& request_id) {
  v1::GenerateResponse out;
  out.set_request_id(request_id);
  out.mutable_token_ids()->Add(update.token_ids.begin(), update.token_ids.end());
  out.set_text(update.text);
  if (!update.finished) return out;
  out.set_finish_reason(ToProtoReason(update.finish_reason));
  out.mutable_usage()->set_prompt_tokens(update.prompt_tokens);
  out.mutable_usage()->set_completion_tokens(update.completion_tokens);
  out.mutable_usage()->set_cached_tokens(update.cached_tokens);
  out.set_elapsed_ms(update.elapsed_ms);
  const SpecStats& s = update.stats;
  v1::SpeculationStats* p = out.mutable_speculation();
  p->set_steps(s.steps);
  p->set_drafted_tokens(s.drafted_tokens);
  p->set_accepted_tokens(s.accepted_tokens);
  p->set_fallback_steps(s.fallback_steps);
  p->mutable_accepted_per_depth()->Add(s.accepted_per_depth.begin(), s.accepted_per_depth.end());
  p->mutable_drafted_per_depth()->Add(s.drafted_per_depth.begin(), s.drafted_per_depth.end());
  p->set_mean_acceptance_length(s.MeanAcceptanceLength());
  p->set_draft_wait_ms(s.draft_wait_ms);
  p->set_forward_ms(s.forward_ms);
  p->set_host_ms(s.host_ms);
  return out;
}

DrafterDescription FromProto(const v1::DrafterInfo& proto) {
  DrafterDescription d;
  d.id = proto.drafter_id();
  d.spec.defaults = FromProto(proto.defaults());
  d.spec.max = FromProto(proto.max());
  for (int mode : proto.modes()) {
    // A kind this build does not know is one its requests cannot name: left out.
    if (const std::optional<DrafterKind> kind = DrafterKindFromProto(mode)) {
      d.kinds.push_back(*kind);
    }
  }
  std::sort(d.kinds.begin(), d.kinds.end());
  d.kinds.erase(std::unique(d.kinds.begin(), d.kinds.end()), d.kinds.end());
  d.default_kind = DrafterKindFromProto(proto.default_mode());
  for (const v1::FeatureNeeds& needs : proto.feature_needs()) {
    if (const std::optional<DrafterKind> kind = DrafterKindFromProto(needs.mode())) {
      d.feature_needs.emplace_back(*kind, FromProto(needs));
    }
  }
  return d;
}

}  // namespace treespec
