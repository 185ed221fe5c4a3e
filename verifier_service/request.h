// Domain types of one generation request (no proto types past the service layer).
#ifndef TREESPEC_VERIFIER_SERVICE_REQUEST_H_
#define TREESPEC_VERIFIER_SERVICE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/sampling.h"
#include "common/tree/drafter_kind.h"
#include "common/tree/spec_limits.h"

namespace treespec {

// The speculation a request asks for: none, AUTO (the drafter's default kind: the draft model
// where it has one, else ngram), or one kind by name.
class SpecMode {
 public:
  static constexpr SpecMode Off() { return SpecMode(How::kOff, DrafterKind::kNgram); }
  static constexpr SpecMode Auto() { return SpecMode(How::kAuto, DrafterKind::kNgram); }
  static constexpr SpecMode Of(DrafterKind kind) { return SpecMode(How::kKind, kind); }

  bool off() const { return how_ == How::kOff; }
  bool automatic() const { return how_ == How::kAuto; }
  // The kind asked for by name; nullopt for Off and Auto.
  std::optional<DrafterKind> kind() const {
    return how_ == How::kKind ? std::optional<DrafterKind>(kind_) : std::nullopt;
  }
  bool operator==(const SpecMode& o) const { return how_ == o.how_ && kind() == o.kind(); }
  bool operator!=(const SpecMode& o) const { return !(*this == o); }

 private:
  enum class How { kOff, kAuto, kKind };
  constexpr SpecMode(How how, DrafterKind kind) : how_(how), kind_(kind) {}
  How how_;
  DrafterKind kind_;  // with How::kKind
};

enum class FinishReason { kNone, kLength, kEos, kStopToken, kStopString, kContext, kCancelled };

// "length", "eos", ... (logs and metric labels).
inline const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

// Optional fields (and `spec`'s zeros) are what the client left unset; Engine::Validate fills
// the defaults, so after it every optional has a value.
struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt;        // [prompt_len] token ids
  std::optional<int> max_new_tokens;  // > 0, prompt + max_new_tokens <= context
  // Set by Validate when max_new_tokens was unset and the default did not fit: max_new_tokens is
  // then the room left in the context, and reaching it ends the request with kContext.
  bool length_is_context = false;
  std::optional<float> top_p;  // (0, 1]; copied into sampling.top_p by Validate
  SamplingConfig sampling;     // temperature, top_k, seed as sent
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  bool return_text = false;
  SpecMode spec_mode = SpecMode::Off();
  // As the client set them, 0 = unset; Validate resolves them (tree budget and depth set).
  SpecLimits spec;
  // Set by Validate when the client left tree_budget unset and the verifier has a step-cost
  // model: spec.tree_budget is then the largest served, a cap, and each step's selection (with
  // the budget it asks of the drafter) decides how much of it to use.
  bool auto_tree_budget = false;
};

struct SpecStats {
  int64_t steps = 0;  // verify steps after prefill
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t fallback_steps = 0;               // steps with no usable draft
  int64_t bad_trees = 0;                    // drafts dropped because they failed validation
  std::vector<int64_t> accepted_per_depth;  // [d]: steps accepting a token at depth d+1
  std::vector<int64_t> drafted_per_depth;   // [d]: steps whose tree reached depth d+1
  double draft_wait_ms = 0;                 // time this request's steps waited for drafts
  double forward_ms = 0;                    // time in the model forward (prefill included)
  double host_ms = 0;                       // the rest of its steps (walk, commit, streaming)
  double MeanAcceptanceLength() const {
    return steps == 0 ? 0.0 : 1.0 + static_cast<double>(accepted_tokens) / steps;
  }
};

// What the engine streams back for a request. The last update has `finished` set.
struct GenerationUpdate {
  std::vector<int32_t> token_ids;  // newly emitted tokens
  std::string text;                // their text (complete UTF-8 characters only)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;  // not OK: the request failed (finished is set too)
  int prompt_tokens = 0;
  int cached_tokens = 0;         // of the prompt, reused from the prefix cache (not prefilled)
  int cache_queried_tokens = 0;  // the prompt's tokens when it was looked up in that cache
  int completion_tokens = 0;
  SpecStats stats;
  double elapsed_ms = 0;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_REQUEST_H_
