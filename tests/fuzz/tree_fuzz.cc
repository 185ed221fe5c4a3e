// Fuzzes draft-tree validation (ValidateDraftedTree: what the verifier and the drafter apply to
// a tree from the network) and everything downstream of it. The validator must accept exactly
// the well-formed trees (checked against a direct restatement of the rules), and a tree it
// accepts must then go through what the engine does with it without leaving its bounds: the
// verify tree, depths, ancestor masks, draft paths, the walk, the engine's cut to the context
// window, and a whole VerifyStep (tree attention, choice, walk, KV commit) on a tiny CPU model.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/tree/token_tree.h"
#include "fuzzer/FuzzedDataProvider.h"
#include "tests/fuzz/fuzz_util.h"

namespace treespec {
namespace {

// Large enough for the verifier's largest tree (max_tree_budget 512 + the bonus) after a prefix.
constexpr int kContext = 1024;
constexpr int kPageSize = 16;

CausalLm& TinyModel() {
  static CausalLm* const model = [] {
    const ModelConfig c = fuzz::TinyFuzzConfig(/*qwen3=*/false, kContext);
    LmOptions options;
    options.kv_pages = kContext / kPageSize;  // one sequence at full context
    options.kv_page_size = kPageSize;
    absl::StatusOr<std::unique_ptr<CausalLm>> lm =
        CreateCpuCausalLm(c, testing::RandomWeights(c, 1), options);
    FUZZ_CHECK(lm.ok(), std::string(lm.status().message()));
    return lm->release();
  }();
  return *model;
}

// The rules of ValidateDraftedTree, restated without sharing its code.
bool WellFormed(const DraftedTree& t, int vocab, int max_nodes, int max_depth) {
  const size_t m = t.tokens.size();
  if (t.parents.size() != m || (!t.logprobs.empty() && t.logprobs.size() != m)) return false;
  if (static_cast<int64_t>(m) > max_nodes) return false;
  std::vector<int> depth(m);
  for (size_t j = 0; j < m; ++j) {
    if (t.tokens[j] < 0 || t.tokens[j] >= vocab) return false;
    if (t.parents[j] < -1 || t.parents[j] >= static_cast<int64_t>(j)) return false;
    depth[j] = t.parents[j] < 0 ? 1 : depth[t.parents[j]] + 1;
    if (depth[j] > max_depth) return false;
  }
  return true;
}

// The accepted path must be a chain from node 0 in which each node is the first child of the
// previous one carrying the previous node's choice, and must end where no child does.
void CheckPath(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
               const std::vector<int32_t>& choice, const std::vector<int32_t>& path) {
  const int n = static_cast<int>(tokens.size());
  const std::string where = absl::StrCat("path [", absl::StrJoin(path, ", "), "] in a tree of ", n,
                                         ", parents [", absl::StrJoin(parents, ", "), "]");
  FUZZ_CHECK(!path.empty() && path[0] == 0, where);
  auto first_child = [&](int32_t node) {
    for (int c = node + 1; c < n; ++c) {
      if (parents[c] == node && tokens[c] == choice[node]) return c;
    }
    return -1;
  };
  for (size_t k = 1; k < path.size(); ++k) {
    FUZZ_CHECK(path[k] > path[k - 1] && path[k] < n, where);
    FUZZ_CHECK(first_child(path[k - 1]) == path[k], where);
  }
  FUZZ_CHECK(first_child(path.back()) == -1, where);
}

void CheckLayout(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                 int max_depth) {
  const size_t n = tokens.size();
  const std::vector<int32_t> depth = NodeDepths(parents);
  FUZZ_CHECK(depth.size() == n && depth[0] == 0, "depths");
  for (size_t i = 1; i < n; ++i) {
    FUZZ_CHECK(parents[i] >= 0 && parents[i] < static_cast<int32_t>(i), absl::StrCat(i));
    FUZZ_CHECK(depth[i] == depth[parents[i]] + 1 && depth[i] <= max_depth, absl::StrCat(i));
  }
  const size_t words = (n + 63) / 64;
  const std::vector<uint64_t> mask = AncestorMask(parents);
  FUZZ_CHECK(mask.size() == n * words, absl::StrCat(mask.size(), " mask words for ", n));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t* row = mask.data() + i * words;
    int bits = 0;
    for (size_t w = 0; w < words; ++w) bits += __builtin_popcountll(row[w]);
    FUZZ_CHECK(bits == depth[i] + 1, absl::StrCat("row ", i, " has ", bits, " bits"));
    for (int32_t a = static_cast<int32_t>(i); a >= 0; a = parents[a]) {
      FUZZ_CHECK((row[a / 64] >> (a % 64)) & 1, absl::StrCat("row ", i, " lacks ancestor ", a));
    }
  }
}

void FuzzTree(FuzzedDataProvider& in) {
  CausalLm& model = TinyModel();
  const int model_vocab = model.config().vocab_size;
  // Mostly the model's vocabulary (so accepted trees can be run), sometimes any bound at all.
  const int vocab = in.ConsumeBool() ? model_vocab : in.ConsumeIntegralInRange(-1, 1 << 20);
  const int max_nodes = in.ConsumeIntegralInRange(-1, 513);
  const int max_depth = in.ConsumeIntegralInRange(-1, 65);
  const int m = in.ConsumeIntegralInRange(0, 260);
  DraftedTree tree;
  for (int j = 0; j < m; ++j) {
    tree.tokens.push_back(in.ConsumeIntegralInRange(-1, vocab));
    // Mostly the previous node or earlier ones, so deep chains and wide fans both appear.
    tree.parents.push_back(in.ConsumeBool() ? j - 1 : in.ConsumeIntegralInRange(-2, j));
    tree.logprobs.push_back(-1.0f);
  }
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      tree.parents.push_back(-1);
      break;
    case 1:
      if (!tree.logprobs.empty()) tree.logprobs.pop_back();
      break;
    case 2:
    case 3:
      tree.logprobs.clear();
      break;
    default:
      break;
  }
  const absl::Status status = ValidateDraftedTree(tree, vocab, max_nodes, max_depth);
  FUZZ_CHECK(status.ok() == WellFormed(tree, vocab, max_nodes, max_depth),
             status.ok() ? std::string("accepted a malformed tree") : status.ToString());
  if (!status.ok()) return;

  const std::vector<std::vector<int32_t>> paths = DraftedPaths(tree);
  FUZZ_CHECK(paths.size() == tree.tokens.size(), "paths");
  for (int j = 0; j < m; ++j) {
    const int parent = tree.parents[j];
    FUZZ_CHECK(paths[j].size() == (parent < 0 ? 1 : paths[parent].size() + 1) &&
                   paths[j].back() == tree.tokens[j],
               absl::StrCat("path of node ", j));
  }

  const int32_t bonus = vocab > 0 ? in.ConsumeIntegralInRange(0, vocab - 1) : 0;
  std::vector<int32_t> tokens, parents;
  ToVerifyTree(bonus, tree, &tokens, &parents);
  FUZZ_CHECK(tokens.size() == tree.tokens.size() + 1 && parents.size() == tokens.size() &&
                 tokens[0] == bonus && parents[0] == -1,
             "verify tree");
  CheckLayout(tokens, parents, max_depth);
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> choice(n);
  for (int32_t& c : choice) c = tokens[in.ConsumeIntegralInRange(0, n - 1)];
  CheckPath(tokens, parents, choice, WalkTree(tokens, parents, choice));

  if (vocab > model_vocab) return;
  // The engine's step: the tree after `committed` slots, cut to the context window.
  const int committed = in.ConsumeIntegralInRange(1, kContext - 1);
  const int room = kContext - committed;
  if (n > room) {
    tokens.resize(room);
    parents.resize(room);
  }
  CheckLayout(tokens, parents, max_depth);
  SeqTree seq_tree;
  seq_tree.seq = model.CreateSequence();
  seq_tree.committed_len = committed;
  seq_tree.tokens = tokens;
  seq_tree.parents = parents;
  FUZZ_CHECK(model.kv_cache().Reserve(seq_tree.seq, committed).ok(), "reserve the prefix");
  StepSpec spec;
  spec.sampling.temperature = in.ConsumeBool() ? 0.0f : 1.0f;
  spec.sampling.seed = in.ConsumeIntegral<uint64_t>();
  absl::StatusOr<std::vector<StepResult>> result = model.VerifyStep({seq_tree}, {spec});
  FUZZ_CHECK(result.ok(), std::string(result.status().message()));
  const StepResult& r = (*result)[0];
  // The walk ran on the model's choices, which only the emitted tokens reveal: the path is a
  // chain from node 0 whose tokens are the emitted ones, and the cache kept the pages of the
  // prefix and the path, no more.
  const std::vector<int32_t> path(r.path.begin(), r.path.end());
  FUZZ_CHECK(!path.empty() && path[0] == 0 && r.emitted.size() == path.size(), "step result");
  for (size_t k = 1; k < path.size(); ++k) {
    FUZZ_CHECK(path[k] > path[k - 1] && path[k] < static_cast<int>(tokens.size()) &&
                   parents[path[k]] == path[k - 1] && tokens[path[k]] == r.emitted[k - 1],
               absl::StrCat("step path at ", k));
  }
  FUZZ_CHECK(r.emitted.back() >= 0 && r.emitted.back() < model_vocab, "bonus");
  const int kept = committed + static_cast<int>(path.size());
  FUZZ_CHECK(
      model.kv_cache().num_reserved_slots(seq_tree.seq) ==
          (kept + kPageSize - 1) / kPageSize * kPageSize,
      absl::StrCat(model.kv_cache().num_reserved_slots(seq_tree.seq), " slots kept for ", kept));
  model.FreeSequence(seq_tree.seq);
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  treespec::FuzzTree(input);
  return 0;
}
