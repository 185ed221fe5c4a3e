// The DFlash drafter (arXiv 2602.06036): one block forward per step over the session's target
// features gives the draft distribution of every depth at once; chain mode takes each depth's
// argmax, tree mode builds DDTree's best tree from the per-depth marginals (BuildDdTree over
// PerDepthCandidates). Sessions read target features (DrafterFactory::features()).
#ifndef TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_

#include <memory>

#include "common/model/dflash_model.h"
#include "drafter_service/draft_model_drafter.h"
#include "drafter_service/drafter.h"

namespace treespec {

struct DflashOptions {
  DraftShape shape = DraftShape::kTree;
};

class DflashSession final : public DraftSession {
 public:
  DflashSession(std::shared_ptr<const CpuDflashModel> model, const DflashOptions& options);
  // Tokens extend the context; features become context rows (a row per context token but the
  // pending bonus: common/tree/draft_context.h).
  absl::Status Append(const DraftContext& added) override;
  // One block after the bonus, max_depth + 1 long (at most the drafter's block size).
  // FAILED_PRECONDITION while the session lacks rows for its context.
  absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) override;

 private:
  std::shared_ptr<const CpuDflashModel> model_;
  const DflashOptions options_;
  DflashContext context_;
  int64_t tokens_ = 0;  // context tokens appended
  int32_t bonus_ = -1;  // the last of them
};

class DflashDrafterFactory final : public DrafterFactory {
 public:
  DflashDrafterFactory(std::shared_ptr<const CpuDflashModel> model, const DflashOptions& options)
      : model_(std::move(model)), options_(options) {}
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;
  FeatureSpec features() const override { return model_->config().features(); }

 private:
  std::shared_ptr<const CpuDflashModel> model_;
  const DflashOptions options_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DFLASH_DRAFTER_H_
