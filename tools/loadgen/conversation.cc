#include "tools/loadgen/conversation.h"

#include <map>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "common/util/mix64.h"
#include "tools/loadgen/serving_stats.h"

namespace treespec::loadgen {
namespace {

// `count` token ids of conversation `conversation`'s turn `turn`.
std::vector<int32_t> TurnTokens(const ConversationOptions& o, int conversation, int turn,
                                int count) {
  std::mt19937_64 rng(
      Mix64(o.seed + kGolden64 * (static_cast<uint64_t>(conversation) * 1000003u + turn)));
  std::uniform_int_distribution<int32_t> id(0, o.vocab_size - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = id(rng);
  return tokens;
}

}  // namespace

int64_t LastTurnTokens(const ConversationOptions& o) {
  return static_cast<int64_t>(o.history_len) +
         static_cast<int64_t>(o.turns - 1) * (o.output_len + o.turn_input_len) + o.output_len;
}

std::vector<Prompt> FirstTurns(const ConversationOptions& o) {
  std::vector<Prompt> prompts;
  for (int c = 0; c < o.conversations; ++c) {
    Prompt p;
    p.token_ids = TurnTokens(o, c, 1, o.history_len);
    p.output_len = o.output_len;
    p.conversation = c;
    p.turn = 1;
    prompts.push_back(std::move(p));
  }
  return prompts;
}

std::optional<Prompt> NextTurn(const ConversationOptions& o, const Prompt& turn,
                               const RequestResult& result) {
  if (turn.turn >= o.turns || !result.record.ok || turn.conversation < 0) return std::nullopt;
  Prompt next;
  next.token_ids = turn.token_ids;
  const std::vector<int32_t>& answer = result.record.output_ids;
  next.token_ids.insert(next.token_ids.end(), answer.begin(), answer.end());
  // The answer's last token was the server's last choice: its K/V was never computed.
  next.reusable_tokens = static_cast<int>(next.token_ids.size()) - (answer.empty() ? 0 : 1);
  const std::vector<int32_t> added =
      TurnTokens(o, turn.conversation, turn.turn + 1, o.turn_input_len);
  next.token_ids.insert(next.token_ids.end(), added.begin(), added.end());
  next.output_len = o.output_len;
  next.conversation = turn.conversation;
  next.turn = turn.turn + 1;
  return next;
}

nlohmann::json SummarizeTurns(absl::Span<const Prompt> prompts,
                              absl::Span<const RequestResult> requests,
                              absl::Span<const double> percentiles) {
  struct Turn {
    std::vector<RequestRecord> records;
    int64_t reusable = 0;
  };
  std::map<int, Turn> turns;
  for (const RequestResult& r : requests) {
    const Prompt& p = prompts[r.index];
    if (p.conversation < 0 || !r.record.ok) continue;
    Turn& t = turns[p.turn];
    t.records.push_back(r.record);
    t.reusable += p.reusable_tokens;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [number, t] : turns) {
    const nlohmann::json all = Summarize(t.records, 0, percentiles);
    nlohmann::json j = {{"turn", number}, {"completed", all["completed"]}};
    // Summarize's TTFT figures but the standard deviation: mean, median, max, p<P>.
    for (const auto& [key, value] : all.items()) {
      if (absl::EndsWith(key, "_ttft_ms") && !absl::StartsWith(key, "std_")) j[key] = value;
    }
    j["total_input_tokens"] = all["total_input_tokens"];
    j["total_cached_tokens"] = all["total_cached_tokens"];
    j["reusable_tokens"] = t.reusable;
    j["reused_share"] = t.reusable > 0 ? nlohmann::json(all["total_cached_tokens"].get<double>() /
                                                        static_cast<double>(t.reusable))
                                       : nlohmann::json(nullptr);
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace treespec::loadgen
