// A drafting session for one request: context in, token tree out.
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFTER_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tree/draft_context.h"
#include "common/tree/spec_limits.h"
#include "common/tree/token_tree.h"

namespace treespec {

class DraftSession {
 public:
  virtual ~DraftSession() = default;
  // Adds to the context (common/tree/draft_context.h). The first call carries the prompt;
  // later calls carry the tokens the verifier emitted, the last of which is the pending bonus,
  // and, for a drafter that takes them, the target's features of the context tokens before it.
  virtual absl::Status Append(const DraftContext& added) = 0;
  // Drafts continuations after the last appended token (the bonus), at most
  // limits.tree_budget nodes and limits.max_depth deep, ranking limits.top_k candidates per
  // expanded node where the drafter ranks any (0 = the tree budget). May be empty.
  virtual absl::StatusOr<DraftedTree> Draft(const SpecLimits& limits) = 0;
  // Append(added), then Draft(limits), in one call: a drafter that batches its sessions' model
  // work (DraftBatcher) runs both as one job, without a round trip between them.
  virtual absl::StatusOr<DraftedTree> AppendAndDraft(const DraftContext& added,
                                                     const SpecLimits& limits) {
    if (absl::Status s = Append(added); !s.ok()) return s;
    return Draft(limits);
  }
  // Of the prompt (the first Append), the tokens whose state the session took from its
  // drafter's prefix cache instead of computing; nullopt for a drafter without one.
  virtual std::optional<int> cached_prompt_tokens() const { return std::nullopt; }
  // Before the first Append, for a session that reads target features: the verifier holds the
  // first `offered` tokens of `prompt` in its prefix cache (a multiple of `page`) and would send
  // no feature rows for them. The session takes their rows from its own prefix cache, as many as
  // it holds in whole pages of its own and `page` tokens up to `offered`, and returns how many:
  // the first Append's rows then begin after them. 0 (the default): it takes none.
  virtual int ReuseCachedPrompt(absl::Span<const int32_t> /*prompt*/, int /*offered*/,
                                int /*page*/) {
    return 0;
  }
};

class DrafterFactory {
 public:
  virtual ~DrafterFactory() = default;
  virtual absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() = 0;
  // The target features its sessions take with every commit; empty: tokens only (the service
  // refuses features sent to such a session).
  virtual FeatureSpec features() const { return {}; }
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFTER_H_
