#include "drafter_service/dflash_drafter.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "drafter_service/ddtree.h"

namespace treespec {

// The session's pending rows appended, then the block [bonus, MASK × depth] after the context
// rows, one bidirectional forward; each depth's ranked marginal from its row.
class DflashSession::BlockJob final : public DraftJob {
 public:
  BlockJob(DflashSession& s, int depth, int k)
      : s_(s), depth_(depth), k_(k), context_{s.seq_, s.rows_, &s.pending_} {}
  const ContextRows* Context() override { return s_.pending_.empty() ? nullptr : &context_; }
  void OnContext() override {
    s_.rows_ += s_.pending_.rows;
    s_.pending_ = TargetFeatures();
  }
  bool NextForward(SeqTree* tree, int* k, TopKRows* rows) override {
    if (done_) return false;
    *tree = DflashBlock(*s_.config_, s_.seq_, s_.rows_, s_.bonus_, depth_ + 1);
    *k = k_;
    *rows = TopKRows::kAllNew;
    return true;
  }
  absl::Status OnForward(CausalLm&, std::vector<std::vector<TokenLogProb>> ranked) override {
    done_ = true;
    marginals_.resize(depth_);
    for (int d = 0; d < depth_; ++d) marginals_[d] = CandidatesOf(ranked[d + 1], k_);
    return absl::OkStatus();
  }
  void OnEnd(CausalLm& model, const absl::Status&) override {
    model.Truncate(s_.seq_, s_.rows_);  // the block's K/V
    // The rows' pages complete as the context grows: cached now, a conversation's next turn
    // finds them even if it opens before this session has ended.
    if (s_.options_.prefix_cache) {
      model.kv_cache().CachePages(s_.seq_, absl::MakeConstSpan(s_.context_).subspan(0, s_.rows_));
    }
  }
  std::vector<std::vector<Candidate>>& marginals() { return marginals_; }

 private:
  DflashSession& s_;
  const int depth_, k_;
  const ContextRows context_;
  bool done_ = false;
  std::vector<std::vector<Candidate>> marginals_;  // [depth][rank]
};

DflashSession::DflashSession(std::shared_ptr<DraftBatcher> batcher,
                             std::shared_ptr<const DflashConfig> config,
                             const DflashOptions& options)
    : batcher_(std::move(batcher)), config_(std::move(config)), options_(options) {
  seq_ = batcher_->WithModel([](CausalLm& m) { return m.CreateSequence(); });
}

DflashSession::~DflashSession() {
  // Its rows' full pages were cached as they completed (BlockJob::OnEnd): they stay.
  batcher_->WithModel([this](CausalLm& m) { m.FreeSequence(seq_); });
}

int DflashSession::ReuseCachedPrompt(absl::Span<const int32_t> prompt, int offered, int page) {
  if (!options_.prefix_cache || offered <= 0 || page <= 0 || tokens_ != 0 || rows_ != 0) return 0;
  return batcher_->WithModel([&](CausalLm& m) {
    const int attached = m.kv_cache().AttachCachedPrefix(seq_, prompt);
    // Whole pages of the verifier's and of ours, so that both cut their caches at page bounds.
    const int own = m.kv_cache().page_size();
    const int unit = std::lcm(own, page);
    const int rows = std::min(attached, offered) / unit * unit;
    if (rows < attached) m.Truncate(seq_, rows);
    rows_ = rows;
    return rows;
  });
}

absl::Status DflashSession::Append(const DraftContext& added) {
  const TargetFeatures& rows = added.features;
  if (!rows.empty() && rows.width != config_->features().width()) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash context rows are ", rows.width,
                                                   " values wide; this drafter reads ",
                                                   config_->features().width()));
  }
  const int window = config_->body.max_position_embeddings - config_->block_size;
  if (!out_of_window_ && static_cast<int64_t>(rows_) + pending_.rows + rows.rows > window) {
    out_of_window_ = true;
    pending_ = TargetFeatures();
  }
  if (!out_of_window_) pending_.Append(rows);
  tokens_ += static_cast<int64_t>(added.tokens.size());
  if (options_.prefix_cache) {
    context_.insert(context_.end(), added.tokens.begin(), added.tokens.end());
  }
  if (!added.tokens.empty()) bonus_ = added.tokens.back();
  return absl::OkStatus();
}

absl::StatusOr<DraftedTree> DflashSession::Draft(const SpecLimits& limits) {
  if (out_of_window_) return DraftedTree();
  if (bonus_ < 0 || rows_ + pending_.rows != tokens_ - 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("a DFlash session drafts from a feature row per context token but the last; "
                     "it has ",
                     rows_ + pending_.rows, " rows for ", tokens_, " tokens"));
  }
  const int depth = std::min(limits.max_depth, config_->block_size - 1);
  if (depth < 1 || limits.tree_budget < 1) return DraftedTree();
  const bool chain = options_.shape == DraftShape::kChain;
  const int k = std::clamp(chain ? 1 : (limits.top_k > 0 ? limits.top_k : limits.tree_budget), 1,
                           config_->body.vocab_size);
  BlockJob job(*this, depth, k);
  if (absl::Status s = batcher_->Run(job); !s.ok()) return s;
  SpecLimits tree_limits = limits;
  tree_limits.max_depth = depth;
  return BuildDdTree(PerDepthCandidates(std::move(job.marginals())), 0, tree_limits);
}

DflashDrafterFactory::DflashDrafterFactory(DflashConfig config, std::unique_ptr<CausalLm> model,
                                           const DflashOptions& options)
    : config_(std::make_shared<const DflashConfig>(std::move(config))),
      batcher_(std::make_shared<DraftBatcher>(std::move(model))),
      options_(options) {}

absl::StatusOr<std::unique_ptr<DraftSession>> DflashDrafterFactory::NewSession() {
  return std::make_unique<DflashSession>(batcher_, config_, options_);
}

}  // namespace treespec
