// The DFlash drafter (arXiv 2602.06036): one block forward per step over the session's target
// features gives the draft distribution of every depth at once; chain mode takes each depth's
// argmax, tree mode builds DDTree's best tree from the per-depth marginals (BuildDdTree over
// PerDepthCandidates). Sessions read target features (DrafterFactory::features()).
//
// The drafter is a CausalLm of the drafter's body (LoadDflashLm): a session's context is one
// sequence of it whose slots are the context rows (CausalLm::AppendContext: the K/V every draft
// layer projects from the target's features), and a draft is one bidirectional forward of the
// block [bonus, MASK × depth] after them, ranked on the backend (ForwardTopK), whose K/V is
// dropped afterwards. Append only keeps the new rows; the draft's job appends them just before
// its block. Sessions' jobs run batched through the factory's DraftBatcher, so N sessions cost
// about one append of all their new rows and one forward of N blocks.
#ifndef TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_

#include <memory>

#include "common/model/dflash_config.h"
#include "drafter_service/draft_batcher.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter.h"

namespace treespec {

struct DflashOptions {
  DraftShape shape = DraftShape::kTree;
  // Prefix cache (--prefix_cache): a session that ends leaves the full pages of its context
  // rows' K/V cached, keyed by their tokens as the verifier's KV pages are (a row is a function
  // of the target's state at its token, so of the tokens up to it); a session whose verifier
  // reuses a cached prompt prefix takes those rows from here (ReuseCachedPrompt).
  bool prefix_cache = true;
};

class DflashSession final : public DraftSession {
 public:
  // Creates the session's sequence in the drafter's KV cache; frees it on destruction.
  DflashSession(std::shared_ptr<DraftBatcher> batcher, std::shared_ptr<const DflashConfig> config,
                const DflashOptions& options);
  ~DflashSession() override;
  DflashSession(const DflashSession&) = delete;
  DflashSession& operator=(const DflashSession&) = delete;

  // Tokens extend the context; features become context rows (a row per context token but the
  // pending bonus: common/tree/draft_context.h), appended to the model by the next Draft (an
  // append that fails fails that Draft, and the next tries again). INVALID_ARGUMENT for rows
  // of another width
  // (the session is unchanged). A context that outgrows the drafter's window (its
  // max_position_embeddings, less a block) ends drafting: later drafts are empty.
  absl::Status Append(const DraftContext& added) override;
  // One block after the bonus, max_depth + 1 long (at most the drafter's block size).
  // FAILED_PRECONDITION while the session lacks rows for its context.
  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override;
  // Attaches the cached pages of rows that begin `prompt`, up to `offered` tokens in whole
  // pages of both sizes (DraftSession::ReuseCachedPrompt).
  int ReuseCachedPrompt(absl::Span<const int32_t> prompt, int offered, int page) override;

 private:
  class BlockJob;

  const std::shared_ptr<DraftBatcher> batcher_;
  const std::shared_ptr<const DflashConfig> config_;
  const DflashOptions options_;
  SeqId seq_ = 0;
  int rows_ = 0;                  // context rows in the sequence (its committed slots)
  TargetFeatures pending_;        // rows appended since, for the next draft to add
  int64_t tokens_ = 0;            // context tokens appended
  std::vector<int32_t> context_;  // those tokens, for the prefix cache
  int32_t bonus_ = -1;            // the last of them
  bool out_of_window_ = false;
};

class DflashDrafterFactory final : public DrafterFactory {
 public:
  // `model`: a CausalLm of config.body (LoadDflashLm).
  DflashDrafterFactory(DflashConfig config, std::unique_ptr<CausalLm> model,
                       const DflashOptions& options);
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;
  FeatureSpec features() const override { return config_->features(); }
  const DflashConfig& config() const { return *config_; }

 private:
  const std::shared_ptr<const DflashConfig> config_;  // shared with the sessions
  const std::shared_ptr<DraftBatcher> batcher_;
  const DflashOptions options_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_
