#include "drafter_service/draft_model_drafter.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "drafter_service/ddtree.h"

namespace treespec {
namespace {

// Logits buffers stay under 64 MiB whatever the vocabulary.
constexpr int64_t kMaxLogitFloats = int64_t{1} << 24;
// Appends of at most this many tokens rank all their rows (see AppendJob).
constexpr int kRankAllRows = 16;

// Candidate prefixes of the tree mode: node 0 is the bonus; every expanded node carries the
// top-K of its next-token distribution. Keys are node indices.
class ExpandedTree final : public CandidateSource {
 public:
  struct Node {
    int32_t token;
    int32_t depth;    // 0 for the bonus
    int32_t parent;   // node index, -1 for the bonus
    int32_t forward;  // index in the SeqTree once forwarded, else -1
  };

  ExpandedTree() {
    nodes_.push_back(Node{-1, 0, -1, -1});
    children_.emplace_back();
  }

  void SetChildren(int32_t node, std::vector<Candidate> ranked) {
    for (Candidate& c : ranked) {
      c.key = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{c.token, nodes_[node].depth + 1, node, -1});
      children_.emplace_back();
    }
    children_[node] = std::move(ranked);
  }

  Node& node(int32_t i) { return nodes_[i]; }
  absl::Span<const Candidate> Children(int32_t key) const override { return children_[key]; }

 private:
  std::vector<Node> nodes_;
  std::vector<std::vector<Candidate>> children_;  // [node][rank]
};

}  // namespace

// Forwards the tokens as a chain in chunks, committing each; the last chunk's last row is the
// context's next-token distribution.
class DraftModelSession::AppendJob final : public DraftJob {
 public:
  AppendJob(DraftModelSession& s, absl::Span<const int32_t> tokens) : s_(s), tokens_(tokens) {
    chunk_ = static_cast<int>(std::clamp<int64_t>(
        std::min<int64_t>(s.options_.append_chunk, kMaxLogitFloats / s.vocab_size_), 1, 1 << 20));
  }
  bool NextForward(SeqTree* tree, int* k, TopKRows* rows) override {
    if (off_ >= tokens_.size()) return false;
    n_ = static_cast<int>(std::min<size_t>(chunk_, tokens_.size() - off_));
    tree->seq = s_.seq_;
    tree->committed_len = s_.committed_len_;
    tree->tokens.assign(tokens_.begin() + off_, tokens_.begin() + off_ + n_);
    tree->parents.resize(n_);
    std::iota(tree->parents.begin(), tree->parents.end(), -1);  // a chain
    *k = std::clamp(s_.options_.max_top_k, 1, s_.vocab_size_);
    // A commit's few tokens rank every row, as tree expansions do, so the batcher runs them in
    // the same forward (one per round); a prompt's chunk ranks only its last row.
    *rows = n_ <= kRankAllRows ? TopKRows::kAllNew : TopKRows::kLastNew;
    return true;
  }
  absl::Status OnForward(CausalLm& model, std::vector<std::vector<TokenLogProb>> ranked) override {
    std::vector<int> path(n_);
    std::iota(path.begin(), path.end(), 0);
    model.Commit(s_.seq_, s_.committed_len_, path);
    s_.committed_len_ += n_;
    off_ += n_;
    if (off_ == tokens_.size()) s_.last_top_ = std::move(ranked.back());
    return absl::OkStatus();
  }

 private:
  DraftModelSession& s_;
  const absl::Span<const int32_t> tokens_;
  int chunk_ = 1, n_ = 0;
  size_t off_ = 0;
};

// What both draft shapes share: the drafted tree, and dropping the draft's K/V at the end.
class DraftModelSession::DraftingJob : public DraftJob {
 public:
  explicit DraftingJob(DraftModelSession& s) : s_(s) {}
  void OnEnd(CausalLm& model, const absl::Status&) override {
    model.Truncate(s_.seq_, s_.committed_len_);  // the draft's K/V
  }
  DraftedTree& result() { return result_; }

 protected:
  DraftModelSession& s_;
  DraftedTree result_;
};

// The tree mode: depth by depth, the nodes of the newest depth in the best tree known so far
// get their children from one forward; the result is the best tree over all candidates.
class DraftModelSession::TreeJob final : public DraftingJob {
 public:
  TreeJob(DraftModelSession& s, const SpecLimits& limits) : DraftingJob(s), limits_(limits) {}
  bool NextForward(SeqTree* tree, int* k, TopKRows* rows) override {
    if (!started_) Start();
    if (done_) return false;
    if (depth_ >= limits_.max_depth) return Finish();
    // A node outside the best-B tree of what is known now stays outside once more candidates
    // arrive, so only the selected nodes of the newest depth need their children.
    BuildDdTree(candidates_, 0, limits_, &keys_);
    expand_.clear();
    // The model holds the forwarded nodes in slots [L, L + n) of the window: near its end,
    // expand only the best (first popped) nodes that still fit. Same for the optional cap.
    int room = s_.context_window_ - s_.committed_len_ - static_cast<int>(forwarded_.tokens.size());
    if (s_.options_.max_expand_per_depth > 0) {
      room = std::min(room, s_.options_.max_expand_per_depth);
    }
    for (int32_t key : keys_) {
      if (candidates_.node(key).depth != depth_) continue;
      if (static_cast<int>(expand_.size()) == room) break;
      expand_.push_back(key);
    }
    if (expand_.empty()) return Finish();
    forwarded_.first_new = static_cast<int>(forwarded_.tokens.size());
    for (int32_t key : expand_) {
      ExpandedTree::Node& node = candidates_.node(key);
      node.forward = static_cast<int32_t>(forwarded_.tokens.size());
      forwarded_.tokens.push_back(node.token);
      forwarded_.parents.push_back(candidates_.node(node.parent).forward);  // -1: the bonus
    }
    *tree = forwarded_;
    *k = k_;
    *rows = TopKRows::kAllNew;
    return true;
  }
  absl::Status OnForward(CausalLm&, std::vector<std::vector<TokenLogProb>> ranked) override {
    for (size_t r = 0; r < expand_.size(); ++r) {
      candidates_.SetChildren(expand_[r], CandidatesOf(ranked.at(r), k_));
    }
    ++depth_;
    return absl::OkStatus();
  }

 private:
  void Start() {
    started_ = true;
    limits_.max_depth = s_.DraftableDepth(limits_.max_depth);
    if (limits_.tree_budget <= 0 || limits_.max_depth <= 0 || s_.last_top_.empty()) {
      done_ = true;
      return;
    }
    k_ = std::min(limits_.top_k > 0 ? limits_.top_k : limits_.tree_budget, s_.vocab_size_);
    candidates_.SetChildren(0, CandidatesOf(s_.last_top_, k_));
    forwarded_.seq = s_.seq_;
    forwarded_.committed_len = s_.committed_len_;
  }
  bool Finish() {
    result_ = BuildDdTree(candidates_, 0, limits_);
    done_ = true;
    return false;
  }

  SpecLimits limits_;
  bool started_ = false, done_ = false;
  int k_ = 1, depth_ = 1;
  ExpandedTree candidates_;
  SeqTree forwarded_;  // every expanded node, depth by depth
  std::vector<int32_t> keys_, expand_;
};

// The chain mode: greedy, one forward per drafted token but the last.
class DraftModelSession::ChainJob final : public DraftingJob {
 public:
  ChainJob(DraftModelSession& s, const SpecLimits& limits) : DraftingJob(s), limits_(limits) {}
  bool NextForward(SeqTree* tree, int* k, TopKRows* rows) override {
    if (!started_) {
      started_ = true;
      n_ = std::min(limits_.tree_budget, s_.DraftableDepth(limits_.max_depth));
      if (n_ <= 0 || s_.last_top_.empty()) return false;
      best_ = s_.last_top_[0];
      chain_.seq = s_.seq_;
      chain_.committed_len = s_.committed_len_;
    }
    if (n_ <= 0 || stopped_) return false;
    const int d = static_cast<int>(result_.tokens.size());
    result_.tokens.push_back(best_.token);
    result_.parents.push_back(d - 1);
    result_.logprobs.push_back(best_.logprob);
    if (d + 1 == n_) return false;
    chain_.tokens.push_back(best_.token);
    chain_.parents.push_back(d - 1);
    chain_.first_new = d;  // nodes [0, d) are in the cache from the previous forward
    *tree = chain_;
    *k = 1;
    *rows = TopKRows::kAllNew;
    return true;
  }
  absl::Status OnForward(CausalLm&, std::vector<std::vector<TokenLogProb>> ranked) override {
    if (ranked.at(0).empty()) {
      stopped_ = true;  // no finite log-prob: nothing more to draft
    } else {
      best_ = ranked[0][0];
    }
    return absl::OkStatus();
  }

 private:
  const SpecLimits limits_;
  bool started_ = false, stopped_ = false;
  int n_ = 0;
  TokenLogProb best_;
  SeqTree chain_;
};

// `first`, then `second` (a draft that reads what the append left), as one job.
class DraftModelSession::ThenJob final : public DraftJob {
 public:
  ThenJob(DraftJob& first, DraftJob& second) : first_(first), second_(second) {}
  bool NextForward(SeqTree* tree, int* k, TopKRows* rows) override {
    if (!in_second_) {
      if (first_.NextForward(tree, k, rows)) return true;
      in_second_ = true;
    }
    return second_.NextForward(tree, k, rows);
  }
  absl::Status OnForward(CausalLm& model, std::vector<std::vector<TokenLogProb>> ranked) override {
    return (in_second_ ? second_ : first_).OnForward(model, std::move(ranked));
  }
  void OnEnd(CausalLm& model, const absl::Status& status) override {
    (in_second_ ? second_ : first_).OnEnd(model, status);
  }
  bool in_second() const { return in_second_; }

 private:
  DraftJob& first_;
  DraftJob& second_;
  bool in_second_ = false;
};

DraftModelSession::DraftModelSession(std::shared_ptr<DraftBatcher> batcher,
                                     const DraftModelOptions& options)
    : batcher_(std::move(batcher)),
      options_(options),
      vocab_size_(batcher_->config().vocab_size),
      context_window_(batcher_->config().max_position_embeddings) {
  seq_ = batcher_->WithModel([this](CausalLm& m) {
    kv_ = &m.kv_cache();
    return m.CreateSequence();
  });
}

DraftModelSession::~DraftModelSession() {
  // Its context's full pages were cached as they completed (EndAppend): they stay.
  batcher_->WithModel([this](CausalLm& m) { m.FreeSequence(seq_); });
}

std::optional<int> DraftModelSession::cached_prompt_tokens() const {
  if (!options_.prefix_cache) return std::nullopt;
  return cached_prompt_tokens_;
}

int DraftModelSession::DraftableDepth(int max_depth) const {
  // A node at depth d sits at position committed_len + d - 1; only nodes above the deepest
  // level are forwarded, so depth may reach window - committed_len + 1.
  return out_of_window_ ? 0 : std::min(max_depth, context_window_ - committed_len_ + 1);
}

bool DraftModelSession::StartAppend(absl::Span<const int32_t>& tokens, absl::Status* status) {
  *status = absl::OkStatus();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size_) {
      *status = absl::InvalidArgumentError(absl::StrCat(
          "token id ", tokens[i], " out of range [0, ", vocab_size_, ") of the draft model"));
      return false;
    }
  }
  if (broken_) {
    *status = absl::FailedPreconditionError(
        "draft session lost its KV cache after an earlier error; open a new session");
    return false;
  }
  if (out_of_window_ || tokens.empty()) return false;
  if (committed_len_ + static_cast<int64_t>(tokens.size()) > context_window_) {
    TS_LOG(kDebug,
           "draft context of %d tokens outgrows the draft model's window of %d: "
           "no more drafts for this session",
           committed_len_ + static_cast<int>(tokens.size()), context_window_);
    out_of_window_ = true;
    last_top_.clear();
    return false;
  }
  if (options_.prefix_cache && committed_len_ == 0 && context_.empty()) {
    // The prompt: never attached whole (its last token's distribution is computed).
    cached_prompt_tokens_ = batcher_->WithModel(
        [&](CausalLm& m) { return m.kv_cache().AttachCachedPrefix(seq_, tokens); });
    committed_len_ = cached_prompt_tokens_;
    context_.assign(tokens.begin(), tokens.begin() + cached_prompt_tokens_);
    tokens.remove_prefix(cached_prompt_tokens_);
  }
  return true;
}

void DraftModelSession::EndAppend(absl::Span<const int32_t> tokens, const absl::Status& status) {
  if (status.ok()) {
    context_.insert(context_.end(), tokens.begin(), tokens.end());
    // Pages complete as the context grows: cached now, a conversation's next turn finds them
    // even if it opens before this session has ended.
    if (options_.prefix_cache) kv_->CachePages(seq_, context_);
  } else {
    broken_ = true;
  }
}

absl::Status DraftModelSession::Append(const DraftContext& added) {
  absl::Span<const int32_t> tokens = added.tokens;
  absl::Status status;
  if (!StartAppend(tokens, &status)) return status;
  AppendJob job(*this, tokens);
  status = batcher_->Run(job);
  EndAppend(tokens, status);
  return status;
}

std::unique_ptr<DraftModelSession::DraftingJob> DraftModelSession::NewDraftJob(
    const SpecLimits& limits) {
  switch (options_.shape) {
    case DraftShape::kChain:
      return std::make_unique<ChainJob>(*this, limits);
    case DraftShape::kTree:
      return std::make_unique<TreeJob>(*this, limits);
  }
  return nullptr;
}

absl::StatusOr<DraftedTree> DraftModelSession::FinishDraft(DraftingJob& job, absl::Status status) {
  if (absl::IsResourceExhausted(status)) {
    // Out of KV pages for the draft only: skip this step, the context is intact.
    TS_LOG(kDebug, "draft skipped: %s", status.ToString());
    return DraftedTree{};
  }
  if (!status.ok()) return status;
  return std::move(job.result());
}

absl::StatusOr<DraftedTree> DraftModelSession::Draft(const SpecLimits& limits) {
  if (broken_) {
    return absl::FailedPreconditionError(
        "draft session lost its KV cache after an earlier error; open a new session");
  }
  std::unique_ptr<DraftingJob> job = NewDraftJob(limits);
  const absl::Status status = batcher_->Run(*job);
  return FinishDraft(*job, status);
}

absl::StatusOr<DraftedTree> DraftModelSession::AppendAndDraft(const DraftContext& added,
                                                              const SpecLimits& limits) {
  absl::Span<const int32_t> tokens = added.tokens;
  absl::Status status;
  if (!StartAppend(tokens, &status)) {
    if (!status.ok()) return status;
    return Draft(limits);  // nothing to append
  }
  AppendJob append(*this, tokens);
  std::unique_ptr<DraftingJob> draft = NewDraftJob(limits);
  ThenJob both(append, *draft);
  status = batcher_->Run(both);
  const bool appended = status.ok() || both.in_second();
  EndAppend(tokens, appended ? absl::OkStatus() : status);
  if (!appended) return status;
  return FinishDraft(*draft, status);
}

DraftModelDrafterFactory::DraftModelDrafterFactory(std::unique_ptr<CausalLm> model,
                                                   const DraftModelOptions& options)
    : batcher_(std::make_shared<DraftBatcher>(std::move(model))), options_(options) {}

absl::StatusOr<std::unique_ptr<DraftSession>> DraftModelDrafterFactory::NewSession() {
  return std::make_unique<DraftModelSession>(batcher_, options_);
}

}  // namespace treespec
