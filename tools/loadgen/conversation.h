// The multi-turn conversation workload (issue 37): each conversation resends its whole history
// every turn, as chat and agent clients do. Turn 1 is a random history of `history_len` tokens;
// turn k + 1 is turn k's prompt, its answer and `turn_input_len` new random tokens, so a server
// with a prefix cache computes only the new part. Conversations run side by side, each turn
// sent `think_time_s` after the previous answer ended, to the verifier that answered it (session
// affinity: its prefix cache holds the conversation); a turn that fails or is cancelled ends its
// conversation. TTFT and the cached tokens are reported per turn number.
#ifndef TREESPEC_TOOLS_LOADGEN_CONVERSATION_H_
#define TREESPEC_TOOLS_LOADGEN_CONVERSATION_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/request_result.h"

namespace treespec::loadgen {

struct ConversationOptions {
  int conversations = 0;   // side by side, >= 1
  int turns = 0;           // per conversation, >= 1
  int history_len = 0;     // turn 1's prompt tokens, >= 1
  int turn_input_len = 0;  // new tokens each later turn adds after the previous answer, >= 1
  int output_len = 0;      // each answer's tokens, >= 1
  double think_time_s = 0;
  int vocab_size = 0;  // token ids from [0, vocab_size)
  uint64_t seed = 0;
};

// The tokens of a conversation's last turn with full answers: its prompt and answer.
int64_t LastTurnTokens(const ConversationOptions& options);

// Turn 1 of every conversation, in conversation order.
std::vector<Prompt> FirstTurns(const ConversationOptions& options);

// The turn after `turn`, which ended with `result`: nullopt after the last turn or when it did
// not complete. Its new tokens depend only on the seed, the conversation and the turn number.
std::optional<Prompt> NextTurn(const ConversationOptions& options, const Prompt& turn,
                               const RequestResult& result);

// Per turn number, ascending, over the completed requests (by index into `prompts`): turn,
// completed, {mean,median,max,p<P>}_ttft_ms, total_input_tokens, total_cached_tokens,
// reusable_tokens (what earlier turns of the same conversation computed) and reused_share
// (cached / reusable tokens; null for turn 1, which has none).
nlohmann::json SummarizeTurns(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> requests,
                              absl::Span<const double> percentiles);

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_CONVERSATION_H_
