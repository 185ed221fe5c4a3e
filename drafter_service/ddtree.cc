#include "drafter_service/ddtree.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace treespec {
namespace {

// A candidate prefix waiting in the heap: child `rank` of the prefix `parent_key`.
struct HeapEntry {
  double score;         // cumulative log-prob of the whole prefix
  double parent_score;  // cumulative log-prob of its parent (0 for children of the bonus)
  int32_t depth;        // 1 for children of the bonus
  int32_t parent_out;   // output index of the parent, -1 = the bonus
  int32_t parent_key;   // source key of the parent
  int32_t rank;         // index into Children(parent_key)
};

// Heap order: true when `a` should pop after `b`.
bool PopsLater(const HeapEntry& a, const HeapEntry& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.depth != b.depth) return a.depth > b.depth;
  if (a.parent_out != b.parent_out) return a.parent_out > b.parent_out;
  return a.rank > b.rank;
}

bool Draftable(float logprob) { return std::isfinite(logprob); }

}  // namespace

PerDepthCandidates::PerDepthCandidates(std::vector<std::vector<Candidate>> ranked)
    : ranked_(std::move(ranked)) {
  for (size_t d = 0; d < ranked_.size(); ++d) {
    for (Candidate& c : ranked_[d]) c.key = static_cast<int32_t>(d + 1);
  }
}

absl::Span<const Candidate> PerDepthCandidates::Children(int32_t key) const {
  if (key < 0 || key >= static_cast<int32_t>(ranked_.size())) return {};
  return ranked_[key];
}

std::vector<Candidate> CandidatesOf(absl::Span<const TokenLogProb> ranked, int k) {
  std::vector<Candidate> out;
  const size_t n = std::min(ranked.size(), static_cast<size_t>(std::max(k, 0)));
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(Candidate{ranked[i].token, ranked[i].logprob, 0});
  return out;
}

std::vector<Candidate> PerDepthCandidates::TopK(absl::Span<const float> logprobs, int k) {
  return CandidatesOf(TopKLogProbs(logprobs, k), k);
}

DraftedTree BuildDdTree(const CandidateSource& source, int32_t root_key, const SpecLimits& limits,
                        std::vector<int32_t>* keys) {
  DraftedTree tree;
  if (keys != nullptr) keys->clear();
  const int budget = limits.tree_budget;
  if (budget <= 0 || limits.max_depth <= 0) return tree;
  tree.tokens.reserve(budget);
  tree.parents.reserve(budget);
  tree.logprobs.reserve(budget);

  // Each pop pushes at most two entries, so the heap never holds more than budget + 1.
  std::vector<HeapEntry> heap;
  heap.reserve(budget + 2);
  auto push = [&heap](const HeapEntry& e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), PopsLater);
  };

  absl::Span<const Candidate> roots = source.Children(root_key);
  if (!roots.empty() && Draftable(roots[0].logprob)) {
    push({roots[0].logprob, 0.0, 1, -1, root_key, 0});
  }
  while (!heap.empty() && static_cast<int>(tree.tokens.size()) < budget) {
    std::pop_heap(heap.begin(), heap.end(), PopsLater);
    const HeapEntry e = heap.back();
    heap.pop_back();

    absl::Span<const Candidate> siblings = source.Children(e.parent_key);
    const Candidate& c = siblings[e.rank];
    const int32_t out = static_cast<int32_t>(tree.tokens.size());
    tree.tokens.push_back(c.token);
    tree.parents.push_back(e.parent_out);
    tree.logprobs.push_back(c.logprob);
    if (keys != nullptr) keys->push_back(c.key);

    const size_t next_rank = static_cast<size_t>(e.rank) + 1;
    if (next_rank < siblings.size() && Draftable(siblings[next_rank].logprob)) {
      push({e.parent_score + siblings[next_rank].logprob, e.parent_score, e.depth, e.parent_out,
            e.parent_key, e.rank + 1});
    }
    if (e.depth < limits.max_depth) {
      absl::Span<const Candidate> children = source.Children(c.key);
      if (!children.empty() && Draftable(children[0].logprob)) {
        push({e.score + children[0].logprob, e.score, e.depth + 1, out, c.key, 0});
      }
    }
  }
  return tree;
}

}  // namespace treespec
