#include "verifier_service/output_processor.h"

#include <algorithm>

namespace treespec {

namespace {
// Largest n <= len such that text[0, n) ends on a UTF-8 character boundary.
size_t Utf8BoundaryAtOrBefore(const std::string& text, size_t len) {
  size_t n = len;
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return n;
}
}  // namespace

OutputProcessor::OutputProcessor(const GenerationRequest& request, const Tokenizer* tokenizer,
                                 std::vector<int32_t> eos_ids)
    : request_(request), tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), decoder_(tokenizer) {
  for (const std::string& s : request_.stop_strings)
    max_stop_len_ = std::max(max_stop_len_, s.size());
}

FinishReason OutputProcessor::StopReasonFor(int32_t token) const {
  if (!request_.ignore_eos &&
      std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    return FinishReason::kEos;
  }
  const auto& stops = request_.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStopToken;
  return FinishReason::kNone;
}

GenerationUpdate OutputProcessor::Append(absl::Span<const int32_t> tokens) {
  GenerationUpdate update;
  for (int32_t token : tokens) {
    if (finished()) break;
    generated_.push_back(token);
    update.token_ids.push_back(token);
    FinishReason reason = StopReasonFor(token);
    const bool needs_text = tokenizer_ != nullptr && (request_.return_text || max_stop_len_ > 0);
    // EOS and stop tokens end the output; their own text is not part of it.
    if (needs_text && reason == FinishReason::kNone) {
      // Ids are validated before they reach here, so decoding cannot fail.
      absl::StatusOr<std::string> decoded = decoder_.Push({token});
      const std::string piece = decoded.ok() ? *std::move(decoded) : std::string();
      text_ += piece;
      for (const std::string& stop : request_.stop_strings) {
        if (stop.empty()) continue;
        // Only the region that the new piece could have completed needs searching.
        const size_t from = text_.size() > piece.size() + stop.size()
                                ? text_.size() - piece.size() - stop.size()
                                : 0;
        const size_t at = text_.find(stop, from);
        if (at != std::string::npos) {
          text_.resize(at);
          reason = FinishReason::kStopString;
          break;
        }
      }
    }
    if (reason == FinishReason::kNone &&
        static_cast<int>(generated_.size()) >= request_.max_new_tokens) {
      // The client asked for no length: the context, not a limit it set, ended the request.
      reason = request_.length_is_context ? FinishReason::kContext : FinishReason::kLength;
    }
    finish_reason_ = reason;
  }
  if (finished()) {
    update.finished = true;
    update.finish_reason = finish_reason_;
  }
  ReleaseText(&update.text, finished());
  update.completion_tokens = completion_tokens();
  return update;
}

GenerationUpdate OutputProcessor::Finish(FinishReason reason) {
  GenerationUpdate update;
  if (!finished()) finish_reason_ = reason;
  update.finished = true;
  update.finish_reason = finish_reason_;
  ReleaseText(&update.text, /*all=*/true);
  update.completion_tokens = completion_tokens();
  return update;
}

void OutputProcessor::ReleaseText(std::string* out, bool all) {
  if (!request_.return_text) return;
  size_t safe = text_.size();
  if (!all && max_stop_len_ > 1) {
    // Hold back a tail that could be the start of a stop string.
    safe = text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
    safe = Utf8BoundaryAtOrBefore(text_, safe);
  }
  if (all) {
    // Bytes of an unfinished character at the very end are emitted as they are, unless the
    // text was cut at a stop string.
    std::string tail = decoder_.Flush();
    if (finish_reason_ != FinishReason::kStopString) text_ += tail;
    safe = text_.size();
  }
  if (safe > text_released_) {
    out->append(text_, text_released_, safe - text_released_);
    text_released_ = safe;
  }
}

}  // namespace treespec
