// The model interface the engine and the draft-model drafter use. One forward call verifies a
// batch of token trees (prefill is a chain tree), writing K/V into the paged cache.
#ifndef TREESPEC_COMMON_MODEL_CAUSAL_LM_H_
#define TREESPEC_COMMON_MODEL_CAUSAL_LM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/sampling.h"
#include "common/model/top_k.h"
#include "common/tree/draft_context.h"

namespace treespec {

// One sequence's part of a forward batch: a forest of nodes after the committed prefix.
struct SeqTree {
  SeqId seq = 0;
  int committed_len = 0;         // L: slots [0, L) hold committed K/V
  std::vector<int32_t> tokens;   // [n] node tokens
  std::vector<int32_t> parents;  // [n] parents[i] in [-1, i); -1 = a root (child of the prefix)
  // Nodes [0, first_new) were computed by an earlier Forward of this same tree (their K/V is in
  // slots L..L+first_new-1); only nodes [first_new, n) are computed now. Lets a drafter grow a
  // tree depth by depth without recomputing it.
  int first_new = 0;
  // DFlash's block: the nodes are a chain (parents[i] = i - 1, node i at position L + i) whose
  // every node attends to all n nodes, later ones included (not causal). first_new must be 0.
  bool bidirectional = false;
};
// Node i sits at position L + depth(i) (roots have depth 0) and its K/V goes to slot L + i. It
// attends to slots [0, L) and to itself and its ancestors. A chain (parents[i] = i - 1) is
// ordinary causal prefill/decoding; the verifier's tree has one root, the bonus token.

// One sequence's context rows for CausalLm::AppendContext: `rows` (not owned) go to slots
// committed_len, committed_len + 1, ... of `seq`.
struct ContextRows {
  SeqId seq = 0;
  int committed_len = 0;
  const TargetFeatures* rows = nullptr;
};

struct LmOptions {
  int tensor_parallel = 1;  // ranks (threads on CPU); any count >= 1, uneven splits allowed
  int kv_pages = 0;         // 0: enough for max_batch sequences at full context
  int kv_page_size = 16;
  int max_batch = 16;  // used to size the default KV pool
};

// Which rows ForwardTopK reduces: every new row (Forward's rows), or only the last new row of
// each batch entry (a drafter appending a chunk of context needs just its last distribution).
enum class TopKRows { kAllNew, kLastNew };

// How VerifyStep treats one batch entry.
struct StepSpec {
  SamplingConfig sampling;  // the request's choice rule (greedy when temperature <= 0)
  // Prefill: the tree is the prompt (a chain from committed_len 0); every node is kept and the
  // target's choice after the last one, at position n, is the first bonus token.
  // Otherwise: node 0 is the pending bonus token and the rest a drafted tree (DESIGN §3).
  bool prefill = false;
  // Also return the target features (feature_layers()) of the rows the step keeps.
  bool capture_features = false;
};

// What one verify step kept of a batch entry.
struct StepResult {
  std::vector<int> path;         // accepted nodes [0, c1, ..., ck] (prefill: 0..n-1)
  std::vector<int32_t> emitted;  // tokens of c1..ck, then the target's choice at ck (the new
                                 // bonus); prefill: just the first bonus
  // With StepSpec::capture_features: a row per path entry (the nodes' own tokens, so the old
  // bonus and the accepted ones; prefill: every prompt token), each the outputs of
  // feature_layers() side by side, rounded to bf16. Otherwise empty.
  TargetFeatures features;
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual const ModelConfig& config() const = 0;
  virtual int tensor_parallel() const = 0;
  virtual std::string device() const = 0;  // "cpu"

  // Sequence lifetime, backed by the paged cache shared by all ranks.
  virtual SeqId CreateSequence() = 0;
  virtual void FreeSequence(SeqId seq) = 0;
  virtual PagedKvCache& kv_cache() = 0;

  // Runs the batch: reserves slots [L, L + n) of each sequence (RESOURCE_EXHAUSTED when out
  // of pages; nothing is written then), writes K/V of the new nodes, and returns their logits:
  // [total new nodes in batch order, vocab] fp32, row-major. INVALID_ARGUMENT for malformed
  // trees or token ids outside [0, vocab).
  // Rows are batch-invariant: a node's logits do not depend on the rest of the batch.
  virtual absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) = 0;

  // Forward, reduced on the backend to what a drafter reads: for each selected row (`rows`, in
  // batch order), its top min(k, vocab) next-token log-probs at temperature 1 as TopKLogProbs
  // (top_k.h) ranks them: descending, lower id first on ties, finite only. Only these pairs
  // leave the backend. INVALID_ARGUMENT for k < 1, else as Forward. The default runs Forward
  // and ranks on the host (the reference); the GPU backend ranks on the device.
  virtual absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ForwardTopK(
      absl::Span<const SeqTree> batch, int k, TopKRows rows);

  // Keeps the accepted path (DESIGN §3 step 5): `path` = [0, c1, ..., ck] node indices of the
  // last Forward for `seq` (node 0 must be the single root); afterwards the committed length is
  // L + k + 1 and later slots are freed. A chain commit of m nodes is path [0, 1, ..., m-1].
  virtual void Commit(SeqId seq, int committed_len, absl::Span<const int> path) = 0;
  // Drops everything from slot `len` on (rollback).
  virtual void Truncate(SeqId seq, int len) = 0;

  // One verify step (DESIGN §3): Forward, the target's choice at every node (ChooseToken at
  // absolute position L + depth + 1), the walk, and the commit of the accepted path. Only
  // the accepted tokens leave the backend. The default runs Forward and does the rest on the
  // host; a GPU backend keeps the logits on the device. `specs` is parallel to `batch`.
  virtual absl::StatusOr<std::vector<StepResult>> VerifyStep(absl::Span<const SeqTree> batch,
                                                             absl::Span<const StepSpec> specs);

  // The layers whose outputs a verify step captures for the specs that ask (each the residual
  // stream after layer l, Transformers' hidden_states[l + 1]); none until set. Set between
  // steps, not per step: a backend sizes its capture buffers here. INVALID_ARGUMENT unless the
  // layers are strictly ascending within [0, num_layers).
  virtual absl::Status SetFeatureLayers(std::vector<int> layers);
  // A model with a context projection (config().context_width > 0, a DFlash drafter's body):
  // appends each entry's rows.rows slots to its sequence after its committed_len slots, whose K/V
  // in every layer come from the rows, not from tokens: c = RMSNorm(row · context_fcᵀ) ·
  // context_norm, then per layer K = RoPE(k_norm(c · Wkᵀ)) and V = c · Wvᵀ at positions
  // committed_len + i (no input norm; the same c feeds every layer). The slots count as
  // committed: the next committed_len is committed_len + rows.rows. One batch runs as one pass
  // over all its rows (the drafter batches its sessions' appends). All or nothing:
  // FAILED_PRECONDITION for a model without a projection; INVALID_ARGUMENT naming the entry for
  // rows of another width, an unknown or repeated sequence, a committed_len beyond its reserved
  // slots or rows past the context; RESOURCE_EXHAUSTED when out of pages.
  virtual absl::Status AppendContext(absl::Span<const ContextRows> batch);
  // One sequence's rows.
  absl::Status AppendContext(SeqId seq, int committed_len, const TargetFeatures& rows) {
    const ContextRows one{seq, committed_len, &rows};
    return AppendContext(absl::MakeConstSpan(&one, 1));
  }
  const std::vector<int>& feature_layers() const { return feature_layers_; }

 protected:
  // Forward, and with `features` non-null also every new row's captured layers, [rows,
  // feature layers × hidden] bf16 bits in batch order, into *features. VerifyStep's host path
  // uses it; the default refuses a non-null `features` (a backend without capture).
  virtual absl::StatusOr<std::vector<float>> ForwardCapturing(absl::Span<const SeqTree> batch,
                                                              std::vector<uint16_t>* features);
  // INVALID_ARGUMENT when a spec asks for features and no feature layers are set.
  absl::Status CheckFeatureCapture(absl::Span<const StepSpec> specs) const;

 private:
  std::vector<int> feature_layers_;
};

// Loads `model_dir` (config.json, *.safetensors) for the CPU backend.
absl::StatusOr<std::unique_ptr<CausalLm>> LoadCpuCausalLm(const std::string& model_dir,
                                                          const LmOptions& options);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_CAUSAL_LM_H_
