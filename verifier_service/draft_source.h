// How the engine gets draft trees, independent of transport (the gRPC client implements it).
#ifndef TREESPEC_VERIFIER_SERVICE_DRAFT_SOURCE_H_
#define TREESPEC_VERIFIER_SERVICE_DRAFT_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/tree/draft_context.h"
#include "common/tree/spec_limits.h"
#include "common/tree/token_tree.h"
#include "verifier_service/request.h"

namespace treespec {

// One request's drafting session. Methods never block on the network.
class DraftStream {
 public:
  virtual ~DraftStream() = default;
  // Sends what the context gained since the last commit: the tokens emitted (the last one is
  // the pending bonus) and, for a drafter that takes them, their target features
  // (common/tree/draft_context.h says which rows). The answering tree should have at most
  // `tree_budget` drafted nodes (0: the session's limit; DraftCommit.tree_budget); kNoTree: the
  // step verifies no tree, none is to be drafted (DraftCommit.no_tree).
  static constexpr int kNoTree = -1;
  virtual void Commit(int64_t step, DraftContext added, int tree_budget) = 0;
  // The tree answering commit `step`, once it has arrived (stale steps are dropped).
  virtual std::optional<DraftedTree> TakeTree(int64_t step) = 0;
  // Trees dropped on arrival since the last call because their step answers no commit sent
  // (ahead of the newest commit, or negative): garbage, which the engine counts as bad trees.
  virtual int64_t TakeMisnumberedTrees() = 0;
  // True while no tree can come for the newest commit: the session has ended (an
  // implementation may open a new one at a later commit).
  virtual bool broken() const = 0;
  // For a session opened with DraftOpenParams::cached_tokens: of those, the prompt tokens whose
  // feature rows the drafter holds (DraftOpened.cached_tokens), once its answer has arrived.
  virtual std::optional<int> opened_cached_tokens() const { return std::nullopt; }
};

struct DraftOpenParams {
  std::string request_id;
  std::vector<int32_t> prompt;
  SpecMode mode = SpecMode::Auto();
  SpecLimits limits;  // as resolved by the engine; a drafter serving less clamps them
  // The target layers every commit's feature rows carry (DraftOpen.feature_layers); empty:
  // the session is sent tokens only.
  std::vector<int> feature_layers;
  // The prompt tokens the verifier holds in its prefix cache and would send no feature rows
  // for, a multiple of `page_size` (its KV page); 0: none (DraftOpen.cached_tokens).
  int cached_tokens = 0;
  int page_size = 0;
};

// What the drafters a source has heard from serve (each states it: Drafter.GetInfo and every
// session's DraftOpened).
struct DrafterPoolInfo {
  int drafters = 0;                // drafters heard from lately; 0 = none (nothing is known)
  SpecLimits max;                  // each field the largest any of them serves
  std::vector<DrafterKind> kinds;  // the kinds some of them serve, sorted
  // The kind AUTO gets, when every one of them states the same default; else nullopt.
  std::optional<DrafterKind> default_kind;
  // The distinct feature needs their kinds state (drafters of one kind may differ).
  std::vector<std::pair<DrafterKind, FeatureSpec>> feature_needs;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Opens a session. `on_arrival` runs (on a transport thread) whenever a tree arrives or the
  // stream ends, so the engine can stop waiting.
  virtual std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                            std::function<void()> on_arrival) = 0;
  virtual std::string target() const = 0;
  // What the pool serves, as far as the source knows now. Any thread.
  virtual DrafterPoolInfo PoolInfo() const { return {}; }
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_DRAFT_SOURCE_H_
