// Turns a request's emitted tokens into streamed deltas and decides when it stops:
// max_new_tokens, EOS, stop token ids, stop strings. Text deltas never split a UTF-8 character
// and, when stop strings are set, hold back text that could still become a stop string.
#ifndef TREESPEC_VERIFIER_SERVICE_OUTPUT_PROCESSOR_H_
#define TREESPEC_VERIFIER_SERVICE_OUTPUT_PROCESSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "verifier_service/request.h"

namespace treespec {

class OutputProcessor {
 public:
  // `tokenizer` may be null (ids only; stop strings and text then unavailable).
  OutputProcessor(const GenerationRequest& request, const Tokenizer* tokenizer,
                  std::vector<int32_t> eos_ids);

  // Appends tokens one by one until a stop condition hits; tokens after it are dropped.
  // Returns the update to stream (ids and text delta); sets finished/finish_reason on stop.
  GenerationUpdate Append(absl::Span<const int32_t> tokens);
  // Flushes held-back text into a final update with the given reason (context full, ...).
  GenerationUpdate Finish(FinishReason reason);

  int completion_tokens() const { return static_cast<int>(generated_.size()); }
  bool finished() const { return finish_reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_reason_; }

 private:
  FinishReason StopReasonFor(int32_t token) const;
  // Moves newly safe text from pending_text_ into `out`.
  void ReleaseText(std::string* out, bool all);

  const GenerationRequest& request_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> eos_ids_;
  IncrementalDecoder decoder_;
  std::vector<int32_t> generated_;
  std::string text_;          // all text decoded so far (for stop-string search)
  size_t text_released_ = 0;  // bytes of text_ already streamed
  size_t max_stop_len_ = 0;
  FinishReason finish_reason_ = FinishReason::kNone;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_OUTPUT_PROCESSOR_H_
