#include "drafter_service/dflash_drafter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/top_k.h"
#include "drafter_service/ddtree.h"

namespace treespec {

DflashSession::DflashSession(std::shared_ptr<const CpuDflashModel> model,
                             const DflashOptions& options)
    : model_(std::move(model)), options_(options) {}

absl::Status DflashSession::Append(const DraftContext& added) {
  if (absl::Status s = model_->Append(context_, added.features); !s.ok()) return s;
  tokens_ += static_cast<int64_t>(added.tokens.size());
  if (!added.tokens.empty()) bonus_ = added.tokens.back();
  return absl::OkStatus();
}

absl::StatusOr<DraftedTree> DflashSession::Draft(const SpecLimits& limits) {
  if (bonus_ < 0 || context_.rows != tokens_ - 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("a DFlash session drafts from a feature row per context token but the last; "
                     "it has ",
                     context_.rows, " rows for ", tokens_, " tokens"));
  }
  const DflashConfig& config = model_->config();
  const int depth = std::min(limits.max_depth, config.block_size - 1);
  if (depth < 1 || limits.tree_budget < 1) return DraftedTree();
  absl::StatusOr<std::vector<float>> logits = model_->BlockLogits(context_, bonus_, depth + 1);
  if (!logits.ok()) return logits.status();
  const int vocab = config.body.vocab_size;
  const bool chain = options_.shape == DraftShape::kChain;
  const int k = chain ? 1 : (limits.top_k > 0 ? limits.top_k : limits.tree_budget);
  std::vector<std::vector<Candidate>> ranked(depth);
  std::vector<float> logprobs(vocab);
  for (int d = 0; d < depth; ++d) {
    LogSoftmax(absl::MakeConstSpan(logits->data() + static_cast<size_t>(d) * vocab, vocab),
               absl::MakeSpan(logprobs));
    ranked[d] = PerDepthCandidates::TopK(logprobs, k);
  }
  SpecLimits tree_limits = limits;
  tree_limits.max_depth = depth;
  return BuildDdTree(PerDepthCandidates(std::move(ranked)), 0, tree_limits);
}

absl::StatusOr<std::unique_ptr<DraftSession>> DflashDrafterFactory::NewSession() {
  return std::make_unique<DflashSession>(model_, options_);
}

}  // namespace treespec
