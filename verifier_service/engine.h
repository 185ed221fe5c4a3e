// The verifier engine (DESIGN §2–§3): admission, prefill, continuous batching of verify steps
// over every running request, the walk and commit, stopping, streaming, fail-open drafting.
// One scheduler thread owns the model; callers talk to it through Submit/Cancel.
#ifndef TREESPEC_VERIFIER_SERVICE_ENGINE_H_
#define TREESPEC_VERIFIER_SERVICE_ENGINE_H_

#include <array>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/causal_lm.h"
#include "common/tokenizer/tokenizer.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/request.h"
#include "verifier_service/speculation_gate.h"
#include "verifier_service/step_cost_model.h"
#include "verifier_service/tree_selection.h"

namespace treespec {

struct EngineOptions {
  int max_batch = 16;    // requests verified together in one forward
  int max_queue = 1024;  // waiting requests beyond this are refused
  // Limits for requests that set none (--tree_budget, --max_depth), and the verifier's own
  // maxima (the protocol's); the maxima its drafters state lower these (spec_bounds()).
  SpecBounds spec{SpecLimits{16, 8, 0}, kSpecCeiling};
  int default_max_new_tokens = 256;
  // Largest max_new_tokens a request may ask for; 0: only the context length bounds it.
  int max_new_tokens_limit = 0;
  int context_length = 0;                                 // 0: the model's max_position_embeddings
  absl::Duration draft_timeout = absl::Milliseconds(50);  // per-step wait for a draft
  int max_consecutive_timeouts = 3;                       // then stop waiting for that session
  // What a verify step costs on this model (step_cost_profiler.h); the engine takes it over and
  // refreshes it from every verify step's measured forward time. With one, every verify step
  // verifies only the drafted nodes that pay (tree_selection.h), and a request that leaves its
  // tree budget unset gets one chosen step by step (GenerationRequest::auto_tree_budget), and
  // asks for no tree at all on steps where waiting for one does not pay (speculation_gate.h).
  // None: every request's drafted tree is verified whole.
  std::optional<StepCostModel> step_cost;
  // With a step-cost model: whether auto requests may ask for no tree (SpeculationGate). Off,
  // they always ask — for tests and measurements of the tree selection alone.
  bool speculation_gate = true;
  // Prefix cache (--prefix_cache; PagedKvCache): a finished request leaves its full pages of
  // final tokens (prompt and output) cached, and a new request reuses the longest cached
  // prefix of its prompt and prefills only the rest. A request whose drafter takes the
  // target's features reuses as much of it as its drafter holds the feature rows of
  // (DraftOpen.cached_tokens).
  bool prefix_cache = true;
  // Chunked prefill (--prefill_chunk): a prompt's uncached part is computed in chunks ending at
  // multiples of this many tokens (absolute positions, so a prompt with a cached prefix computes
  // the same chunks as a cold one), and a step takes at most this many prompt tokens in all
  // beside the running requests' verify trees (the first prompt's chunk always fits), so no
  // running stream waits for a whole long prefill. 0: each prompt whole in one step.
  int prefill_chunk = 2048;
};

// Flag-level checks (the message names the flag); the engine assumes options that pass.
absl::Status ValidateEngineOptions(const EngineOptions& options);

// Per-request bounds on stop conditions, which every emitted token is checked against.
inline constexpr size_t kMaxStopTokenIds = 64;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
// Every stream message and log line of the request carries its id.
inline constexpr size_t kMaxRequestIdBytes = 256;

// Receives a request's updates, on the engine thread. Must not block.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnUpdate(GenerationUpdate update) = 0;
};

// What the tree selection and the speculation gate did for one drafter kind's requests.
struct SelectionCounts {
  int64_t drafted_nodes = 0;     // in the trees that arrived for verify steps
  int64_t verified_nodes = 0;    // of them, the ones the selection kept
  double expected_accepted = 0;  // drafted tokens the selection expected to be accepted
  int64_t accepted = 0;          // drafted tokens accepted
  // Steps of auto requests (GenerationRequest::auto_tree_budget) that asked for a tree, and
  // that asked for none (SpeculationGate).
  int64_t auto_tree_steps = 0;
  int64_t auto_plain_steps = 0;

  void Add(const SelectionCounts& other);
};

// How the step-cost model's predictions compared with the verify steps' measured forward
// times (steps with a prefill are not verify steps and are left out), and what the selection
// and the gate did.
struct StepCostStats {
  // Upper bounds of the measured / predicted buckets (a Prometheus histogram's "le").
  static constexpr std::array<double, 10> kRatioBounds{0.5,  0.8, 0.9,  0.95, 1.0,
                                                       1.05, 1.1, 1.25, 2.0,  4.0};
  int64_t steps = 0;
  // By DraftSourceIndex: per drafter kind, then AUTO sessions (whose kind the verifier does
  // not know).
  std::array<SelectionCounts, kNumDraftSources> by_kind{};
  SelectionCounts Total() const;
  SelectionCounts& Of(DraftSourceKind kind) { return by_kind[DraftSourceIndex(kind)]; }
  const SelectionCounts& Of(DraftSourceKind kind) const { return by_kind[DraftSourceIndex(kind)]; }
  double predicted_ms = 0;  // summed over the steps
  double measured_ms = 0;
  double ratio_sum = 0;                                     // of measured / predicted
  std::array<int64_t, kRatioBounds.size()> ratio_counts{};  // not cumulative; above 4: none
};

struct EngineSnapshot {
  int running = 0;
  int queued = 0;
  int kv_pages_free = 0;  // free and evictable (cached, unheld) pages
  int kv_pages_total = 0;
  int kv_page_size = 0;
  int kv_pages_cached = 0;                 // in the prefix cache, held or not
  int64_t kv_pages_evicted = 0;            // cached pages evicted so far
  int64_t prefill_steps = 0;               // steps that computed prompt tokens
  int64_t prefill_chunks = 0;              // prompt chunks computed (a whole prompt is one)
  std::optional<StepCostStats> step_cost;  // with a step-cost model
};

class Engine {
 public:
  // `tokenizer` may be null (ids only); `drafts` may be null (no speculation).
  Engine(CausalLm* model, const Tokenizer* tokenizer, DraftSource* drafts, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const { return options_; }
  int context_length() const { return options_.context_length; }
  // Largest max_new_tokens any request may ask for: the limit, or context length - 1 (the
  // shortest prompt is one token).
  int max_new_tokens_limit() const;

  // Fills defaults and checks `request` against the model and limits. INVALID_ARGUMENT (etc.)
  // with a message naming the field.
  absl::Status Validate(GenerationRequest& request) const;
  // The speculation limits a request is resolved against now: options().spec with the maxima
  // lowered to the largest its drafters serve, once any drafter has stated them. Any thread.
  SpecBounds spec_bounds() const;
  // Queues a validated request and returns its handle. RESOURCE_EXHAUSTED when the queue is
  // full, UNAVAILABLE after Shutdown. Updates go to `sink` until one with finished=true.
  absl::StatusOr<uint64_t> Submit(GenerationRequest request, std::shared_ptr<RequestSink> sink);
  // Stops a request at the next step and frees its KV pages; its sink gets no more updates.
  void Cancel(uint64_t handle);
  // Starts a graceful stop: new requests are refused (UNAVAILABLE, "draining"), the ones already
  // accepted (queued or running) go on to their end.
  void Drain();
  // Waits until no request is queued or running, at most `timeout`; whether that happened.
  bool WaitIdle(absl::Duration timeout) const;
  // Finishes the scheduler thread; running requests end with FinishReason::kCancelled.
  void Shutdown();

  EngineSnapshot Snapshot() const;

  // The context an auto request gains over steps without a tree is sent to its drafter once it
  // reaches this many tokens (opening the session then if none is open): a drafter never lags
  // far, and a request that ends sooner costs it nothing.
  static constexpr int kMaxDeferredTokens = 64;
  // The longest a request waits for its drafter's answer on the cached prompt rows before its
  // prefill (at least the draft timeout).
  static constexpr absl::Duration kOpenTimeout = absl::Milliseconds(500);

 private:
  struct Active;

  // The speculation part of Validate: mode and limits against the drafters' statements.
  absl::Status ValidateSpeculation(GenerationRequest& request) const;

  void Loop();
  void Admit();
  // The target layers a session of `mode` is sent features of (empty: tokens only): those the
  // pool's drafters of its kind (AUTO: the pool's default kind) read, when trained for this
  // target; the model is made to capture them. An AUTO that resolves to such a kind becomes it.
  std::vector<int> FeatureLayersFor(SpecMode& mode);
  // Opens `active`'s drafting session; its trees wake the engine as they arrive.
  void OpenDraft(Active& active, const DraftOpenParams& open);
  // Whether a step should wait (up to the deadline) for this request's draft.
  bool WaitsForDraft(const Active& a) const;
  // KV pages the front of the queue needs if it can be admitted now, else 0. Needs mu_.
  int FrontPagesIfAdmissible() const;
  // Pages `r` takes at most: its prompt, output and largest tree.
  int WorstPages(const GenerationRequest& r) const;
  // Whether `r`'s drafter kind takes the target's features: its session then says which of the
  // cached prompt rows its drafter holds, and the request reuses only those (ResolveOpen).
  bool TakesFeatures(const GenerationRequest& r) const;
  // For a request waiting for its drafter's answer on the cached prompt rows (awaiting_open):
  // whether it can go on now — the answer arrived (the cached prefix is cut to the rows the
  // drafter holds), or the session broke or kept silent past kOpenTimeout (the request keeps
  // its cached prefix and runs without speculation).
  bool ResolveOpen(Active& active, absl::Time now);
  void DropCancelled();
  // Blocks until enough requests can be verified (DESIGN §2 overlap) and returns them.
  std::vector<Active*> WaitForReady();
  // Gives each member still prefilling its next prompt chunk (EngineOptions::prefill_chunk), in
  // admission order while the step's prompt-token budget lasts; the others sit this step out.
  void PlanPrefill(std::vector<Active*>& members);
  // One verify step (prefill for new requests) over `members`: build the batch (taking each
  // request's draft), run it, apply each request's result. Whether it prefilled a prompt.
  bool Step(const std::vector<Active*>& members);
  // Each member's tree: its prompt as a chain (prefill), else the bonus and its draft.
  std::vector<SeqTree> BuildBatch(const std::vector<Active*>& members);
  // The request's draft for this step if it arrived and is valid (else an empty tree: the step
  // verifies the bonus alone); counts bad trees and missed deadlines.
  DraftedTree TakeDraft(Active& active);
  absl::StatusOr<std::vector<StepResult>> RunBatch(const std::vector<Active*>& members,
                                                   const std::vector<SeqTree>& batch);
  // The model failed the step: every member ends with INTERNAL.
  void FailStep(const std::vector<Active*>& members, const absl::Status& status);
  struct StepTiming {
    double build_ms = 0;    // host time before the forward
    double forward_ms = 0;  // the model's VerifyStep
    absl::Time forward_end;
  };
  // Keeps of each member's drafted tree (`drafts`, parallel to `members`) the nodes that pay
  // (SelectNodes), remembering what each kept for the calibration; the prompts prefilled in
  // the same step are priced in (PrefillLoad).
  void SelectTrees(const std::vector<Active*>& members, std::vector<DraftedTree>& drafts);
  // The step-cost model's shape of a step over `batch` (a prompt counts as a sequence of its
  // tokens), or with `verify_members_only` over the entries whose member (`members`, in order)
  // prefills no prompt; batch 0 when there are none. Summed in place.
  static StepShape ShapeOf(const std::vector<Active*>& members, const std::vector<SeqTree>& batch,
                           bool verify_members_only);
  // Scores the step that ended at `end` for the speculation gate, per drafter kind of its gated
  // requests (results parallel to members), less `prompt_ms` (what the step-cost model prices
  // the prompts it prefilled at, if any). Every step, so that the next one's interval starts
  // here.
  void ObserveGate(const std::vector<Active*>& members, const std::vector<StepResult>& results,
                   double prompt_ms, absl::Time end);
  // A verify step of `shape` took `forward_ms`: the cost model's prediction is scored and the
  // model refreshed. Not for steps with a prefill.
  void ObserveStepCost(const StepShape& shape, double forward_ms);
  // Commits the accepted path, streams the emitted tokens, finishes or commits to the drafter.
  void ApplyResult(Active& active, const SeqTree& tree, StepResult result,
                   const StepTiming& timing);
  // One verify step's speculation counters: `accepted` drafted tokens of `tree`'s.
  void RecordSpecStats(Active& active, const SeqTree& tree, int accepted);
  // Tells the drafter what a step added to the request's context, asking for the next tree
  // (an auto request's SpeculationGate may ask for none: the context is then deferred, up to
  // kMaxDeferredTokens).
  void CommitToDrafter(Active& active, std::vector<int32_t> emitted, TargetFeatures features);
  // Sends the final update and releases the request (KV pages, draft session).
  void Finish(Active& active, GenerationUpdate update);
  void Release(Active& active);
  void RemoveFinished();
  int PagesFor(int slots) const;

  CausalLm* model_;
  const Tokenizer* tokenizer_;
  DraftSource* drafts_;
  EngineOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // new work, cancels, arrived drafts, shutdown
  std::deque<std::unique_ptr<Active>> queue_;
  absl::flat_hash_set<uint64_t> cancelled_;
  uint64_t next_handle_ = 1;
  bool shutdown_ = false;
  bool draining_ = false;
  int running_count_ = 0;     // mirror of running_.size() for Snapshot
  int64_t draft_events_ = 0;  // bumped on every arrival, so waits can't miss one

  std::vector<std::unique_ptr<Active>> running_;  // engine thread only
  std::optional<StepCostModel> step_cost_;        // engine thread only
  bool has_step_cost_ = false;                    // step_cost_.has_value(), for any thread
  AcceptanceCalibration calibration_;             // engine thread only
  SpeculationGate gate_;                          // engine thread only
  // Per DraftSourceIndex, the tree budget the last auto request asked for (0: none yet).
  std::array<int, kNumDraftSources> last_ask_budget_{};  // engine thread only
  // When the last step's forward ended; InfinitePast after an idle spell (engine thread).
  absl::Time last_step_end_ = absl::InfinitePast();
  StepCostStats step_cost_stats_;  // guarded by mu_
  int64_t prefill_steps_ = 0;      // guarded by mu_
  int64_t prefill_chunks_ = 0;     // guarded by mu_
  std::thread thread_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_ENGINE_H_
