// Draft-model drafter (DESIGN §4): a small causal LM with the target's tokenizer, shared by all
// sessions of the drafter process. Each session keeps its context in the model's KV cache and
// drafts either a greedy chain or a tree grown depth by depth (one batched forward per depth)
// and then DDTree-selected under the budget. Every forward asks the model for the top-k
// log-probs of its rows (CausalLm::ForwardTopK), so on a GPU the ranking runs on the device and
// only k (token, log-prob) pairs per row cross PCIe, never a row of the vocabulary. Sessions'
// forwards run batched together through the factory's DraftBatcher (draft_batcher.h).
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFT_MODEL_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFT_MODEL_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/causal_lm.h"
#include "drafter_service/draft_batcher.h"
#include "drafter_service/drafter.h"

namespace treespec {

enum class DraftShape { kTree, kChain };

struct DraftModelOptions {
  DraftShape shape = DraftShape::kTree;
  // Candidates kept of the context's last distribution between Append and Draft: the most any
  // Draft may use (the service's largest tree budget). A larger budget or top_k gets at most
  // this many children of the bonus token.
  int max_top_k = 256;
  // Tree mode expands, at each depth, the nodes of that depth in the best tree known so far —
  // exact (the result is the best-first tree over the model's top-K children), but the first
  // depth always costs K rows. > 0 caps the rows per depth (the best nodes first): cheaper on
  // a CPU, where rows cost; the tree may then miss some of the exact tree's nodes.
  int max_expand_per_depth = 0;
  // Tokens per forward while appending (bounds the [chunk, vocab] logits buffer).
  int append_chunk = 256;
  // Prefix cache (--prefix_cache) in the draft model's paged KV, keyed as the verifier's is
  // (PagedKvCache): a session that ends leaves the full pages of its context cached, and a new
  // session's prompt reuses the longest cached run of them, computing only the rest.
  bool prefix_cache = true;
};

class DraftModelSession final : public DraftSession {
 public:
  // Creates the session's sequence in the model's KV cache; frees it on destruction. Sessions
  // hold a shared_ptr, so the batcher (and its model) outlives every session.
  DraftModelSession(std::shared_ptr<DraftBatcher> batcher, const DraftModelOptions& options);
  ~DraftModelSession() override;
  DraftModelSession(const DraftModelSession&) = delete;
  DraftModelSession& operator=(const DraftModelSession&) = delete;

  // Forwards the tokens as a chain (in chunks) and commits them; keeps the last token's top
  // log-probs as the depth-1 distribution. INVALID_ARGUMENT for ids outside the vocab,
  // RESOURCE_EXHAUSTED when the KV pool is full (the session is unusable afterwards).
  // Tokens beyond the model's context window are accepted but end drafting: later drafts
  // are empty.
  absl::Status Append(const DraftContext& added) override;
  // Chain: greedy, min(budget, depth) nodes. Tree: see the file comment. The draft's K/V is
  // dropped afterwards (the cache is truncated back to the committed context).
  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override;
  // Both as one batcher job.
  absl::StatusOr<DraftedTree> AppendAndDraft(const DraftContext& added,
                                             const SpecLimits& limits) override;

  int committed_len() const { return committed_len_; }
  std::optional<int> cached_prompt_tokens() const override;

 private:
  class AppendJob;
  class DraftingJob;  // TreeJob's and ChainJob's base
  class TreeJob;
  class ChainJob;
  class ThenJob;

  // Depths a draft may reach from the committed context (0 once past the window).
  int DraftableDepth(int max_depth) const;
  // Checks the tokens; false when there is nothing to forward: *status is the error, or ok
  // (no tokens, or tokens past the window, which end drafting). The prompt's first tokens that
  // the prefix cache holds are attached and dropped from `tokens`.
  bool StartAppend(absl::Span<const int32_t>& tokens, absl::Status* status);
  // After an append of `tokens` ended with `status`: the context grows by them, or the
  // session is broken (earlier chunks may be committed).
  void EndAppend(absl::Span<const int32_t> tokens, const absl::Status& status);
  // The draft job of this session's shape for `limits`.
  std::unique_ptr<DraftingJob> NewDraftJob(const SpecLimits& limits);
  // The job's tree after it ran with `status` (the job dropped its K/V when it ended).
  absl::StatusOr<DraftedTree> FinishDraft(DraftingJob& job, absl::Status status);

  const std::shared_ptr<DraftBatcher> batcher_;
  const DraftModelOptions options_;
  const int vocab_size_;
  const int context_window_;  // the draft model's max positions
  SeqId seq_ = 0;
  int committed_len_ = 0;         // tokens whose K/V are in the cache
  bool out_of_window_ = false;    // the context outgrew the draft model: no more drafts
  bool broken_ = false;           // an Append failed half-way: the cache no longer matches
  std::vector<int32_t> context_;  // the committed tokens, for the prefix cache
  PagedKvCache* kv_ = nullptr;    // the model's (thread-safe on its own)
  int cached_prompt_tokens_ = 0;
  // The top max_top_k of log p(next | context), ranked; empty before any token.
  std::vector<TokenLogProb> last_top_;
};

class DraftModelDrafterFactory final : public DrafterFactory {
 public:
  DraftModelDrafterFactory(std::unique_ptr<CausalLm> model, const DraftModelOptions& options);
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;
  const ModelConfig& config() const { return batcher_->config(); }

 private:
  const std::shared_ptr<DraftBatcher> batcher_;
  const DraftModelOptions options_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFT_MODEL_DRAFTER_H_
