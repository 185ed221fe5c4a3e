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

// The first k of a ranked list as DDTree candidates (keys are filled in by the tree).
std::vector<Candidate> Ranked(absl::Span<const TokenLogProb> top, int k) {
  std::vector<Candidate> out;
  out.reserve(std::min<size_t>(k, top.size()));
  for (size_t i = 0; i < top.size() && static_cast<int>(i) < k; ++i) {
    out.push_back(Candidate{top[i].token, top[i].logprob, 0});
  }
  return out;
}

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

DraftModelSession::DraftModelSession(std::shared_ptr<SharedCausalLm> lm,
                                     const DraftModelOptions& options)
    : lm_(std::move(lm)),
      options_(options),
      vocab_size_(lm_->model->config().vocab_size),
      context_window_(lm_->model->config().max_position_embeddings) {
  std::lock_guard<std::mutex> lock(lm_->mu);
  seq_ = lm_->model->CreateSequence();
}

DraftModelSession::~DraftModelSession() {
  std::lock_guard<std::mutex> lock(lm_->mu);
  lm_->model->FreeSequence(seq_);
}

absl::StatusOr<std::vector<std::vector<TokenLogProb>>> DraftModelSession::ForwardTopK(
    const SeqTree& tree, int k, TopKRows rows) {
  std::lock_guard<std::mutex> lock(lm_->mu);
  return lm_->model->ForwardTopK(absl::MakeConstSpan(&tree, 1), k, rows);
}

void DraftModelSession::TruncateToCommitted() {
  std::lock_guard<std::mutex> lock(lm_->mu);
  lm_->model->Truncate(seq_, committed_len_);
}

absl::Status DraftModelSession::Append(absl::Span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " out of range [0, ",
                                                     vocab_size_, ") of the draft model"));
    }
  }
  if (broken_) {
    return absl::FailedPreconditionError(
        "draft session lost its KV cache after an earlier error; open a new session");
  }
  if (out_of_window_ || tokens.empty()) return absl::OkStatus();
  if (committed_len_ + static_cast<int64_t>(tokens.size()) > context_window_) {
    TS_LOG(kDebug,
           "draft context of %d tokens outgrows the draft model's window of %d: "
           "no more drafts for this session",
           committed_len_ + static_cast<int>(tokens.size()), context_window_);
    out_of_window_ = true;
    last_top_.clear();
    return absl::OkStatus();
  }

  const int max_top_k = std::clamp(options_.max_top_k, 1, vocab_size_);
  const int chunk = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(options_.append_chunk, kMaxLogitFloats / vocab_size_), 1, 1 << 20));
  std::vector<int> path;
  for (size_t off = 0; off < tokens.size(); off += chunk) {
    const int n = static_cast<int>(std::min<size_t>(chunk, tokens.size() - off));
    SeqTree tree;
    tree.seq = seq_;
    tree.committed_len = committed_len_;
    tree.tokens.assign(tokens.begin() + off, tokens.begin() + off + n);
    tree.parents.resize(n);
    std::iota(tree.parents.begin(), tree.parents.end(), -1);  // a chain
    path.resize(n);
    std::iota(path.begin(), path.end(), 0);
    absl::StatusOr<std::vector<std::vector<TokenLogProb>>> top;
    {
      std::lock_guard<std::mutex> lock(lm_->mu);
      top = lm_->model->ForwardTopK(absl::MakeConstSpan(&tree, 1), max_top_k, TopKRows::kLastNew);
      if (top.ok()) lm_->model->Commit(seq_, committed_len_, path);
    }
    if (!top.ok()) {
      broken_ = true;  // earlier chunks are committed: the cache no longer matches the context
      return top.status();
    }
    committed_len_ += n;
    if (off + n == tokens.size()) last_top_ = std::move(top->at(0));
  }
  return absl::OkStatus();
}

absl::StatusOr<DraftedTree> DraftModelSession::Draft(const DraftLimits& limits) {
  if (broken_) {
    return absl::FailedPreconditionError(
        "draft session lost its KV cache after an earlier error; open a new session");
  }
  if (last_top_.empty() || out_of_window_) return DraftedTree{};
  // A node at depth d sits at position committed_len + d - 1; only nodes above the deepest
  // level are forwarded, so depth may reach window - committed_len + 1.
  const int max_depth = std::min(limits.max_depth, context_window_ - committed_len_ + 1);
  const int budget = limits.tree_budget;
  if (budget <= 0 || max_depth <= 0) return DraftedTree{};

  absl::StatusOr<DraftedTree> tree;
  switch (options_.shape) {
    case DraftShape::kChain:
      tree = DraftChain(budget, max_depth);
      break;
    case DraftShape::kTree:
      tree = DraftTree(budget, max_depth);
      break;
  }
  TruncateToCommitted();
  if (!tree.ok() && absl::IsResourceExhausted(tree.status())) {
    // Out of KV pages for the draft only: skip this step, the context is intact.
    TS_LOG(kDebug, "draft skipped: %s", tree.status().ToString());
    return DraftedTree{};
  }
  return tree;
}

absl::StatusOr<DraftedTree> DraftModelSession::DraftChain(int budget, int max_depth) {
  const int n = std::min(budget, max_depth);
  DraftedTree out;
  SeqTree chain;
  chain.seq = seq_;
  chain.committed_len = committed_len_;
  TokenLogProb best = last_top_[0];
  for (int d = 0; d < n; ++d) {
    out.tokens.push_back(best.token);
    out.parents.push_back(d - 1);
    out.logprobs.push_back(best.logprob);
    if (d + 1 == n) break;
    chain.tokens.push_back(best.token);
    chain.parents.push_back(d - 1);
    chain.first_new = d;  // nodes [0, d) are in the cache from the previous step
    ASSIGN_OR_RETURN(const std::vector<std::vector<TokenLogProb>> top,
                     ForwardTopK(chain, 1, TopKRows::kAllNew));
    if (top[0].empty()) break;  // no finite log-prob: nothing to draft
    best = top[0][0];
  }
  return out;
}

absl::StatusOr<DraftedTree> DraftModelSession::DraftTree(int budget, int max_depth) {
  const int k = std::min(options_.top_k > 0 ? options_.top_k : budget, vocab_size_);
  const DraftLimits limits{budget, max_depth};
  ExpandedTree candidates;
  candidates.SetChildren(0, Ranked(last_top_, k));

  SeqTree forwarded;  // every expanded node, depth by depth
  forwarded.seq = seq_;
  forwarded.committed_len = committed_len_;
  std::vector<int32_t> keys, expand;
  for (int depth = 1; depth < max_depth; ++depth) {
    // A node outside the best-B tree of what is known now stays outside once more candidates
    // arrive, so only the selected nodes of the newest depth need their children.
    BuildDdTree(candidates, 0, limits, &keys);
    expand.clear();
    // The model holds the forwarded nodes in slots [L, L + n) of the window: near its end,
    // expand only the best (first popped) nodes that still fit. Same for the optional cap.
    int room = context_window_ - committed_len_ - static_cast<int>(forwarded.tokens.size());
    if (options_.max_expand_per_depth > 0) room = std::min(room, options_.max_expand_per_depth);
    for (int32_t key : keys) {
      if (candidates.node(key).depth != depth) continue;
      if (static_cast<int>(expand.size()) == room) break;
      expand.push_back(key);
    }
    if (expand.empty()) break;
    forwarded.first_new = static_cast<int>(forwarded.tokens.size());
    for (int32_t key : expand) {
      ExpandedTree::Node& node = candidates.node(key);
      node.forward = static_cast<int32_t>(forwarded.tokens.size());
      forwarded.tokens.push_back(node.token);
      forwarded.parents.push_back(candidates.node(node.parent).forward);  // -1 under the bonus
    }
    ASSIGN_OR_RETURN(const std::vector<std::vector<TokenLogProb>> top,
                     ForwardTopK(forwarded, k, TopKRows::kAllNew));
    for (size_t r = 0; r < expand.size(); ++r) candidates.SetChildren(expand[r], Ranked(top[r], k));
  }
  return BuildDdTree(candidates, 0, limits);
}

DraftModelDrafterFactory::DraftModelDrafterFactory(std::unique_ptr<CausalLm> model,
                                                   const DraftModelOptions& options)
    : lm_(std::make_shared<SharedCausalLm>(std::move(model))), options_(options) {}

absl::StatusOr<std::unique_ptr<DraftSession>> DraftModelDrafterFactory::NewSession() {
  return std::make_unique<DraftModelSession>(lm_, options_);
}

}  // namespace treespec
