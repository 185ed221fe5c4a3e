#include "verifier_service/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/model/sampling.h"
#include "common/util/log.h"
#include "verifier_service/output_processor.h"

namespace treespec {

struct Engine::Active {
  uint64_t handle = 0;
  GenerationRequest request;
  std::shared_ptr<RequestSink> sink;
  std::unique_ptr<OutputProcessor> output;
  std::unique_ptr<DraftStream> draft;  // null: no speculation for this request (yet)
  // A gated auto request's session, not opened until its first tree is asked for (or its
  // deferred context is due): plain steps then cost the drafter not even the prompt's prefill.
  std::optional<DraftOpenParams> unopened;
  SeqId seq = 0;
  int committed_len = 0;         // L: tokens whose K/V are in the cache
  int cached_tokens = 0;         // of the prompt, attached from the prefix cache at admission
  bool cache_queried = false;    // the prompt was looked up in the prefix cache
  std::vector<int32_t> context;  // the prompt, then every emitted token
  int32_t bonus = -1;            // the target's last choice, not yet in the cache
  bool prefilled = false;
  // While prefilling: where this step's chunk of the prompt ends (PlanPrefill), and the
  // captured features of the chunks before it, sent to the drafter with the first bonus.
  int chunk_end = 0;
  TargetFeatures prefill_features;
  // Opened with cached prompt tokens on offer (DraftOpenParams::cached_tokens): its prefill
  // waits for the drafter's answer on which of their feature rows it holds (ResolveOpen).
  bool awaiting_open = false;
  absl::Time open_deadline;  // past it, no answer: the request goes on without speculation
  int64_t step = 0;          // step of the last commit sent to the drafter
  absl::Time commit_sent;
  int timeouts = 0;  // consecutive steps without a draft in time
  // The target layers its commits carry features of (DraftOpenParams::feature_layers); empty:
  // tokens only.
  std::vector<int> feature_layers;
  std::optional<DraftedTree> tree;  // the draft for `step`, once taken
  // With a step-cost model: the tree budget the next commit asks of the drafter (0: the
  // session's), and of the tree this step verifies, the kept nodes' depths and path
  // probabilities (for the calibration; `selected` once the selection has run on it).
  int ask_budget = 0;
  // Whether this step's commit asked for a tree (an auto request's SpeculationGate may ask for
  // none), and when it chose: a step it runs on a choice from before the gate's last switch is
  // not scored.
  bool tree_asked = true;
  absl::Time chose_at;
  // A gated request of a feature-taking kind whose session was not open at a plain step: that
  // step's features were not captured (plain steps would pay for capturing every request's
  // hidden states), so its drafter could never be given the whole context — it runs plain to
  // its end, touching no drafter, still counted by the gate as on the plain arm.
  bool plain_only = false;
  // What the context gained over steps that asked for no tree, not yet sent: the drafter hears
  // it with the next commit, so that plain steps cost the drafter (often on the same GPU, or
  // the same cores) nothing.
  DraftContext deferred;
  bool selected = false;
  int offered_nodes = 0;         // drafted nodes of the tree the selection ran on
  double expected_accepted = 0;  // of the kept nodes, by their calibrated chances
  std::vector<int> kept_depths;
  std::vector<double> kept_probs;
  SpecStats stats;
  absl::Time start;
  int pages = 0;  // worst-case KV pages (WorstPages) at admission
  bool done = false;

  bool speculates() const { return draft != nullptr || unopened.has_value(); }
  // Whether a step now would capture the features its drafter needs: a session that takes
  // them, open or still to be opened for a tree asked (or the prompt, on the prefill step).
  bool captures() const {
    return !feature_layers.empty() && (draft != nullptr || (unopened.has_value() && !plain_only &&
                                                            (!prefilled || tree_asked)));
  }
};

namespace {

// The drafter kind a session of `mode` lands on in `pool`: the kind asked for, or for AUTO the
// pool's default (none for OFF, or AUTO without a default).
std::optional<DrafterKind> KindOf(const SpecMode& mode, const DrafterPoolInfo& pool) {
  return mode == SpecMode::Auto() ? pool.default_kind : mode.kind();
}

absl::Status InvalidArgument(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// The tree budget an auto request asks of its drafter next, after a step whose selection kept
// `kept` of the `offered` nodes of a tree asked for `asked`: twice what it kept when it kept all
// (room to find the point where nodes stop paying; a drafter that sent fewer than asked is
// asked the same again), else what it kept with some headroom (half as many again, at least 2,
// so a saturated verifier still sees a few candidates). No tree (a late or silent drafter)
// says nothing about the budget: the ask stays. Within [1, cap].
int NextTreeBudget(int asked, int offered, int kept, int cap) {
  if (offered == 0) return asked;
  const int next = kept >= offered ? std::max(asked, 2 * kept) : kept + std::max(2, kept / 2);
  return std::clamp(next, 1, cap);
}

}  // namespace

void SelectionCounts::Add(const SelectionCounts& o) {
  drafted_nodes += o.drafted_nodes;
  verified_nodes += o.verified_nodes;
  expected_accepted += o.expected_accepted;
  accepted += o.accepted;
  auto_tree_steps += o.auto_tree_steps;
  auto_plain_steps += o.auto_plain_steps;
}

SelectionCounts StepCostStats::Total() const {
  SelectionCounts total;
  for (const SelectionCounts& c : by_kind) total.Add(c);
  return total;
}

absl::Status ValidateEngineOptions(const EngineOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.max_batch < 1) return bad(absl::StrCat("--max_batch must be >= 1 (got ", o.max_batch, ")"));
  // Every request waits in the queue before its first step, so 0 would refuse them all.
  if (o.max_queue < 1) return bad(absl::StrCat("--max_queue must be >= 1 (got ", o.max_queue, ")"));
  SpecFlagNames names;
  names.max_tree_budget = "spec.max.tree_budget (the verifier's own largest tree)";
  names.max_depth_limit = "spec.max.max_depth (the verifier's own deepest tree)";
  if (absl::Status s = ValidateSpecBounds(o.spec, names); !s.ok()) return s;
  if (o.default_max_new_tokens < 1) {
    return bad(absl::StrCat("--max_new_tokens must be >= 1 (got ", o.default_max_new_tokens, ")"));
  }
  if (o.max_new_tokens_limit < 0) {
    return bad(absl::StrCat("--max_new_tokens_limit must be >= 0 (got ", o.max_new_tokens_limit,
                            "); 0 = only the context length bounds max_new_tokens"));
  }
  if (o.max_new_tokens_limit > 0 && o.default_max_new_tokens > o.max_new_tokens_limit) {
    return bad(absl::StrCat("--max_new_tokens (", o.default_max_new_tokens,
                            ") must be <= --max_new_tokens_limit (", o.max_new_tokens_limit, ")"));
  }
  if (o.prefill_chunk < 0) {
    return bad(absl::StrCat("--prefill_chunk must be >= 0 (got ", o.prefill_chunk,
                            "); 0 = each prompt whole in one step"));
  }
  if (o.context_length < 0) {
    return bad(absl::StrCat("--context_length must be >= 0 (got ", o.context_length, ")"));
  }
  if (o.draft_timeout < absl::ZeroDuration()) return bad("--draft_timeout_ms must be >= 0");
  if (o.max_consecutive_timeouts < 0) return bad("max_consecutive_timeouts must be >= 0");
  return absl::OkStatus();
}

Engine::Engine(CausalLm* model, const Tokenizer* tokenizer, DraftSource* drafts,
               EngineOptions options)
    : model_(model), tokenizer_(tokenizer), drafts_(drafts), options_(std::move(options)) {
  step_cost_ = std::move(options_.step_cost);
  options_.step_cost.reset();
  has_step_cost_ = step_cost_.has_value();
  const int model_context = model_->config().max_position_embeddings;
  if (options_.context_length <= 0 || options_.context_length > model_context) {
    options_.context_length = model_context;
  }
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

int Engine::max_new_tokens_limit() const {
  const int by_context = options_.context_length - 1;
  return options_.max_new_tokens_limit > 0 ? std::min(options_.max_new_tokens_limit, by_context)
                                           : by_context;
}

int Engine::PagesFor(int slots) const {
  const int page = model_->kv_cache().page_size();
  return (slots + page - 1) / page;
}

absl::Status Engine::Validate(GenerationRequest& r) const {
  const int vocab = model_->config().vocab_size;
  const int context = options_.context_length;
  const int prompt_len = static_cast<int>(r.prompt.size());
  if (r.id.size() > kMaxRequestIdBytes) {
    return InvalidArgument(absl::StrCat("request_id has ", r.id.size(), " bytes; at most ",
                                        kMaxRequestIdBytes, " are allowed"));
  }
  if (r.prompt.empty()) {
    return InvalidArgument("prompt is empty: set `text` or `token_ids` to at least one token");
  }
  for (int i = 0; i < prompt_len; ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return InvalidArgument(absl::StrCat("prompt token id ", r.prompt[i], " at index ", i,
                                          " is out of range [0, ", vocab, ")"));
    }
  }
  if (prompt_len >= context) {
    return InvalidArgument(absl::StrCat("prompt has ", prompt_len,
                                        " tokens but the context length is ", context,
                                        "; shorten it to at most ", context - 1, " tokens"));
  }
  if (r.max_new_tokens.has_value()) {
    if (*r.max_new_tokens <= 0) {
      return InvalidArgument(
          absl::StrCat("sampling.max_new_tokens must be > 0 (got ", *r.max_new_tokens, ")"));
    }
    // Not `prompt_len + max_new_tokens`: a client's INT32_MAX would overflow that sum, pass, and
    // later turn the page count negative (prompt_len < context was checked above).
    if (*r.max_new_tokens > context - prompt_len) {
      return InvalidArgument(absl::StrCat("prompt (", prompt_len,
                                          " tokens) + sampling.max_new_tokens (", *r.max_new_tokens,
                                          ") exceeds the context length ", context,
                                          "; set max_new_tokens <= ", context - prompt_len));
    }
    if (options_.max_new_tokens_limit > 0 && *r.max_new_tokens > options_.max_new_tokens_limit) {
      return InvalidArgument(absl::StrCat(
          "sampling.max_new_tokens is ", *r.max_new_tokens, " but this server allows at most ",
          options_.max_new_tokens_limit, " (--max_new_tokens_limit)"));
    }
  } else {
    r.max_new_tokens = std::min(options_.default_max_new_tokens, context - prompt_len);
    r.length_is_context = options_.default_max_new_tokens > context - prompt_len;
  }
  const float t = r.sampling.temperature;
  if (!std::isfinite(t) || t < 0) {
    return InvalidArgument(absl::StrCat("sampling.temperature must be a finite number >= 0 (got ",
                                        t, "); 0 means greedy"));
  }
  if (r.top_p.has_value()) {
    if (!(*r.top_p > 0.0f && *r.top_p <= 1.0f)) {
      return InvalidArgument(absl::StrCat("sampling.top_p must be in (0, 1] (got ", *r.top_p, ")"));
    }
  } else {
    r.top_p = 1.0f;
  }
  r.sampling.top_p = *r.top_p;
  if (r.sampling.top_k < 0) {
    return InvalidArgument(
        absl::StrCat("sampling.top_k must be >= 0 (got ", r.sampling.top_k, "); 0 = no limit"));
  }
  // Every emitted token is checked against all stop ids and strings on the engine thread, so
  // their number and length are bounded: one client must not slow every other request.
  if (r.stop_token_ids.size() > kMaxStopTokenIds || r.stop_strings.size() > kMaxStopStrings) {
    return InvalidArgument(absl::StrCat("at most ", kMaxStopTokenIds, " stop_token_ids and ",
                                        kMaxStopStrings, " stop_strings are allowed (got ",
                                        r.stop_token_ids.size(), " and ", r.stop_strings.size(),
                                        ")"));
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= vocab) {
      return InvalidArgument(
          absl::StrCat("sampling.stop_token_ids: id ", id, " is out of range [0, ", vocab, ")"));
    }
  }
  for (const std::string& s : r.stop_strings) {
    if (s.empty()) return InvalidArgument("sampling.stop_strings must not contain empty strings");
    if (s.size() > kMaxStopStringBytes) {
      return InvalidArgument(absl::StrCat("sampling.stop_strings: a stop string has ", s.size(),
                                          " bytes; at most ", kMaxStopStringBytes, " are allowed"));
    }
    if (tokenizer_ == nullptr) {
      return absl::FailedPreconditionError(
          "sampling.stop_strings need a tokenizer, and this server has none");
    }
  }
  if (!r.spec_mode.off() && drafts_ == nullptr) {
    if (!r.spec_mode.automatic()) {
      return absl::FailedPreconditionError(
          "this verifier has no drafter (start it with --drafter=HOST:PORT); use speculation "
          "mode AUTO or OFF");
    }
    r.spec_mode = SpecMode::Off();
  }
  if (absl::Status s = ValidateSpeculation(r); !s.ok()) return s;
  const int need = WorstPages(r);
  if (need > model_->kv_cache().num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs ", need, " KV-cache pages but the cache has ",
        model_->kv_cache().num_pages(), " in all; lower max_new_tokens or raise --kv_pages"));
  }
  return absl::OkStatus();
}

SpecBounds Engine::spec_bounds() const {
  SpecBounds bounds = options_.spec;
  if (drafts_ != nullptr) {
    const DrafterPoolInfo pool = drafts_->PoolInfo();
    if (pool.drafters > 0) bounds.max = ClampSpecLimits(bounds.max, pool.max);
  }
  return bounds;
}

absl::Status Engine::ValidateSpeculation(GenerationRequest& r) const {
  const DrafterPoolInfo pool = drafts_ != nullptr ? drafts_->PoolInfo() : DrafterPoolInfo{};
  SpecBounds bounds = options_.spec;
  SpecLimitSources sources;
  sources.max_depth = "the deepest tree this verifier serves";
  if (pool.drafters > 0) {
    // A request no drafter can serve is refused here, not run without speculation later; a
    // default above what they serve is lowered to it.
    bounds.max = ClampSpecLimits(bounds.max, pool.max);
    sources.tree_budget = absl::StrCat("the largest --max_tree_budget of the ", pool.drafters,
                                       " drafter(s) this verifier has heard from");
  }
  r.auto_tree_budget = has_step_cost_ && r.spec.tree_budget == 0 && !r.spec_mode.off();
  if (r.auto_tree_budget) r.spec.tree_budget = bounds.max.tree_budget;
  absl::StatusOr<SpecLimits> spec = ResolveSpecLimits(r.spec, bounds, "speculation.", sources);
  if (!spec.ok()) return spec.status();
  r.spec = *spec;
  const std::optional<DrafterKind> kind = r.spec_mode.kind();
  if (pool.drafters > 0 && kind.has_value() &&
      std::find(pool.kinds.begin(), pool.kinds.end(), *kind) == pool.kinds.end()) {
    const DrafterKindInfo& info = InfoOf(*kind);
    return absl::FailedPreconditionError(
        absl::StrCat("speculation.mode ", info.mode_name, ": none of the ", pool.drafters,
                     " drafter(s) this verifier has heard from serves it (they serve ",
                     DrafterModeNames(pool.kinds),
                     "); use AUTO or one of those, or start drafters with ", info.needs));
  }
  // A kind that reads the target's features serves only the target it was trained for.
  absl::Status mismatch;
  for (const auto& [needs_kind, needs] : pool.feature_needs) {
    if (!kind.has_value() || needs_kind != *kind) continue;
    const ModelConfig& c = model_->config();
    mismatch = CheckFeatureTarget(
        needs, c.hidden_size, c.num_layers, c.vocab_size,
        absl::StrCat("speculation.mode ", InfoOf(*kind).mode_name, ": its drafter"));
    if (mismatch.ok()) return mismatch;  // one drafter of the pool fits
  }
  return mismatch;
}

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request,
                                        std::shared_ptr<RequestSink> sink) {
  auto active = std::make_unique<Active>();
  active->request = std::move(request);
  active->sink = std::move(sink);
  active->start = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("the server is shutting down; retry elsewhere");
  if (draining_) {
    return absl::UnavailableError(
        "the server is draining (shutting down after its running requests); retry elsewhere");
  }
  if (static_cast<int>(queue_.size()) >= options_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request queue is full (", options_.max_queue, " waiting); retry later"));
  }
  active->handle = next_handle_++;
  const uint64_t handle = active->handle;
  queue_.push_back(std::move(active));
  cv_.notify_all();
  return handle;
}

void Engine::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Engine::WaitIdle(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_count_ == 0 && queue_.empty()) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Engine::Cancel(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.insert(handle);
  cv_.notify_all();
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_ && !thread_.joinable()) return;
    shutdown_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

EngineSnapshot Engine::Snapshot() const {
  EngineSnapshot s;
  std::lock_guard<std::mutex> lock(mu_);
  s.running = running_count_;
  s.queued = static_cast<int>(queue_.size());
  s.kv_pages_free = model_->kv_cache().free_pages();
  s.kv_pages_total = model_->kv_cache().num_pages();
  s.kv_page_size = model_->kv_cache().page_size();
  s.kv_pages_cached = model_->kv_cache().cached_pages();
  s.kv_pages_evicted = model_->kv_cache().evicted_pages();
  s.prefill_steps = prefill_steps_;
  s.prefill_chunks = prefill_chunks_;
  if (step_cost_.has_value()) s.step_cost = step_cost_stats_;
  return s;
}

void Engine::Loop() {
  while (true) {
    // Time idle with nothing running is no step's: the next step's interval starts with it.
    if (running_.empty()) last_step_end_ = absl::InfinitePast();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !queue_.empty() || !running_.empty(); });
      if (shutdown_) break;
    }
    DropCancelled();
    RemoveFinished();  // frees their batch slots before admission
    Admit();
    if (running_.empty()) continue;
    const absl::Time wait_start = absl::Now();
    std::vector<Active*> ready = WaitForReady();
    const double wait_ms = absl::ToDoubleMilliseconds(absl::Now() - wait_start);
    // Cancels that came in while waiting: released (done) but still owned by running_, since
    // `ready` points at them; RemoveFinished after the step (or at the top) frees them.
    DropCancelled();
    ready.erase(std::remove_if(ready.begin(), ready.end(), [](Active* a) { return a->done; }),
                ready.end());
    if (ready.empty()) continue;
    PlanPrefill(ready);
    for (Active* a : ready) a->stats.draft_wait_ms += wait_ms;
    const absl::Time step_start = absl::Now();
    const bool prefills = Step(ready);
    TS_LOG(kDebug, "step: %d of %d requests%s, draft wait %.2f ms, step %.2f ms",
           static_cast<int>(ready.size()), static_cast<int>(running_.size()),
           prefills ? " (prefill)" : "", wait_ms,
           absl::ToDoubleMilliseconds(absl::Now() - step_start));
    RemoveFinished();
  }
  // Shutdown: everything still here ends now.
  std::deque<std::unique_ptr<Active>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
  }
  for (auto& q : queued) running_.push_back(std::move(q));
  for (auto& a : running_) {
    if (a->done) continue;  // cancelled during the last wait: released, not yet removed
    GenerationUpdate update;
    update.finished = true;
    update.finish_reason = FinishReason::kCancelled;
    update.status = absl::UnavailableError("the server is shutting down");
    Finish(*a, std::move(update));
  }
  RemoveFinished();
}

void Engine::DropCancelled() {
  absl::flat_hash_set<uint64_t> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_.empty()) return;
    cancelled.swap(cancelled_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (cancelled.contains((*it)->handle)) {
        TS_LOG(kInfo, "request %s cancelled while queued", (*it)->request.id);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& a : running_) {
    if (a->done || !cancelled.contains(a->handle)) continue;
    TS_LOG(kInfo, "request %s cancelled after %d tokens", a->request.id,
           a->output->completion_tokens());
    Release(*a);
  }
}

bool Engine::WaitsForDraft(const Active& a) const {
  // After max_consecutive_timeouts misses the session counts as slow and steps stop waiting
  // for it; every kProbeInterval-th step still waits once, so a drafter that has recovered
  // (or was only slow for a while) gets speculation back.
  constexpr int kProbeInterval = 16;
  const int over = a.timeouts - options_.max_consecutive_timeouts;
  return over < 0 || over % kProbeInterval == kProbeInterval - 1;
}

int Engine::WorstPages(const GenerationRequest& r) const {
  return PagesFor(static_cast<int>(r.prompt.size()) + *r.max_new_tokens + r.spec.tree_budget + 1);
}

bool Engine::TakesFeatures(const GenerationRequest& r) const {
  if (r.spec_mode.off() || drafts_ == nullptr) return false;
  // As FeatureLayersFor resolves the kind, without its side effects.
  const DrafterPoolInfo pool = drafts_->PoolInfo();
  const std::optional<DrafterKind> kind = KindOf(r.spec_mode, pool);
  if (!kind.has_value()) return false;
  for (const auto& [needs_kind, needs] : pool.feature_needs) {
    if (needs_kind == *kind) return true;
  }
  return false;
}

bool Engine::ResolveOpen(Active& a, absl::Time now) {
  const std::optional<int> held =
      a.draft != nullptr ? a.draft->opened_cached_tokens() : std::nullopt;
  if (!held.has_value() && a.draft != nullptr && !a.draft->broken() && now < a.open_deadline) {
    return false;
  }
  a.awaiting_open = false;
  if (!held.has_value()) {
    // No answer: the drafter would lack rows the verifier does not compute, so the request keeps
    // its cached prefix and runs without speculation.
    TS_LOG(kDebug, "request %s: no answer on the cached prompt rows; without speculation",
           a.request.id);
    a.draft.reset();
    a.feature_layers.clear();
    return true;
  }
  // The drafter holds rows of the first *held cached tokens (whole pages of ours): the rest
  // of the prefix is computed again, with its features.
  const int keep = std::clamp(*held, 0, a.cached_tokens) / model_->kv_cache().page_size() *
                   model_->kv_cache().page_size();
  if (keep < a.cached_tokens) {
    model_->Truncate(a.seq, keep);
    a.cached_tokens = keep;
    a.committed_len = keep;
  }
  return true;
}

int Engine::FrontPagesIfAdmissible() const {
  if (queue_.empty() || static_cast<int>(running_.size()) >= options_.max_batch) return 0;
  const GenerationRequest& r = queue_.front()->request;
  const PagedKvCache& kv = model_->kv_cache();
  // Admitted when the free pages (cached ones no request holds included: they are evicted on
  // demand) cover what every running request may still take beside its worst case, counting a
  // page that several requests share once. The front's cached prefix pages that some request
  // holds cost it nothing.
  int growth = 0;
  for (const auto& a : running_) {
    if (!a->done) growth += std::max(0, a->pages - kv.num_reserved_slots(a->seq) / kv.page_size());
  }
  const int need = WorstPages(r), room = kv.free_pages() - growth;
  if (room >= need) return need;
  // Only short of room does the prompt's cached prefix get looked up (hashing the prompt). A
  // request whose drafter takes features may end up reusing less of it: it counts on none.
  const int shared =
      options_.prefix_cache && !TakesFeatures(r) ? kv.HeldCachedPrefixPages(r.prompt) : 0;
  // Otherwise it waits for pages to free up.
  return room >= need - shared ? need : 0;
}

void Engine::Admit() {
  while (true) {
    std::unique_ptr<Active> a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int need = FrontPagesIfAdmissible();
      if (need == 0) break;
      a = std::move(queue_.front());
      queue_.pop_front();
      a->pages = need;
      running_count_ = static_cast<int>(running_.size()) + 1;
    }
    a->seq = model_->CreateSequence();
    a->context = a->request.prompt;
    if (options_.prefix_cache) {
      a->cache_queried = true;
      // Its prefill starts after the cached prefix (never the whole prompt: the last token's
      // logits are computed).
      a->cached_tokens = model_->kv_cache().AttachCachedPrefix(a->seq, a->request.prompt);
      a->committed_len = a->cached_tokens;
    }
    a->output =
        std::make_unique<OutputProcessor>(a->request, tokenizer_, model_->config().eos_token_ids);
    if (!a->request.spec_mode.off() && drafts_ != nullptr) {
      DraftOpenParams open;
      open.request_id = a->request.id;
      open.prompt = a->request.prompt;
      open.mode = a->request.spec_mode;
      open.limits = a->request.spec;
      open.feature_layers = FeatureLayersFor(open.mode);
      a->feature_layers = open.feature_layers;
      const bool deferred = a->request.auto_tree_budget && options_.speculation_gate;
      if (!open.feature_layers.empty() && a->cached_tokens > 0 &&
          (!deferred ||
           gate_.WantsTree(a->request.spec_mode.kind(), static_cast<int>(running_.size()) + 1))) {
        // Its drafter must hold the feature rows of the cached prefix, which no step computes:
        // the session opens now, and the prefill waits for its answer on which it holds.
        open.cached_tokens = a->cached_tokens;
        open.page_size = model_->kv_cache().page_size();
        OpenDraft(*a, open);
        a->awaiting_open = true;
        a->open_deadline = absl::Now() + std::max(options_.draft_timeout, kOpenTimeout);
      } else if (deferred) {
        // A gated request the gate keeps plain for now: with a cached prefix whose rows its
        // drafter was never given, it stays plain (as one whose plain steps went uncaptured).
        a->plain_only = !open.feature_layers.empty() && a->cached_tokens > 0;
        a->unopened = std::move(open);
      } else {
        OpenDraft(*a, open);
      }
      a->stats.accepted_per_depth.assign(a->request.spec.max_depth, 0);
      a->stats.drafted_per_depth.assign(a->request.spec.max_depth, 0);
      if (a->request.auto_tree_budget) {
        // Where the last request of its kind got to, else the default: a new request does not
        // ramp up from scratch (a 128-token request at τ 6 has only ~20 steps).
        const int last = last_ask_budget_[DraftSourceIndex(a->request.spec_mode.kind())];
        a->ask_budget = std::min(last > 0 ? last : options_.spec.defaults.tree_budget,
                                 a->request.spec.tree_budget);
      }
    }
    running_.push_back(std::move(a));
  }
}

void Engine::OpenDraft(Active& a, const DraftOpenParams& open) {
  a.draft = drafts_->Open(open, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    ++draft_events_;
    cv_.notify_all();
  });
}

std::vector<int> Engine::FeatureLayersFor(SpecMode& mode) {
  const DrafterPoolInfo pool = drafts_->PoolInfo();
  const std::optional<DrafterKind> kind = KindOf(mode, pool);
  if (!kind.has_value()) return {};
  // Every layer some drafter of the kind trained for this target reads: the session lands on
  // one of them, and each keeps its own layers of the rows.
  const ModelConfig& c = model_->config();
  std::vector<int> layers;
  for (const auto& [needs_kind, needs] : pool.feature_needs) {
    if (needs_kind != *kind ||
        !CheckFeatureTarget(needs, c.hidden_size, c.num_layers, c.vocab_size, "").ok()) {
      continue;
    }
    layers = LayersUnion(layers, needs.layers);
  }
  if (layers.empty()) return {};
  if (!LayersInclude(model_->feature_layers(), layers)) {
    // Grow-only: requests already running keep their layers, and a backend re-sizes its
    // capture (the GPU re-captures its graphs) only when a new layer is first asked for.
    const std::vector<int> captured = LayersUnion(model_->feature_layers(), layers);
    if (absl::Status s = model_->SetFeatureLayers(captured); !s.ok()) {
      // The session then opens without features, its drafter refuses it, and the request runs
      // without speculation (fail open).
      TS_LOG(kError, "capturing target layers [%s] for %s drafters failed: %s",
             absl::StrJoin(captured, ", "), DrafterKindName(*kind), std::string(s.message()));
      return {};
    }
    TS_LOG(kInfo, "capturing target layers [%s] for %s drafters", absl::StrJoin(captured, ", "),
           DrafterKindName(*kind));
  }
  // AUTO is sent as the kind it resolved to, so a drafter whose default differs refuses the
  // features rather than drafting from half a context.
  mode = SpecMode::Of(*kind);
  return layers;
}

std::vector<Engine::Active*> Engine::WaitForReady() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<Active*> ready;
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time next_deadline = absl::InfiniteFuture();
    ready.clear();
    for (auto& a : running_) {
      if (a->done) continue;
      if (a->awaiting_open && !ResolveOpen(*a, now)) {
        next_deadline = std::min(next_deadline, a->open_deadline);
        continue;
      }
      if (!a->prefilled || a->draft == nullptr || !a->tree_asked) {
        ready.push_back(a.get());  // prefill, no speculation, no tree asked: nothing to wait for
        continue;
      }
      if (!a->tree.has_value()) a->tree = a->draft->TakeTree(a->step);
      const absl::Time deadline = a->commit_sent + options_.draft_timeout;
      if (a->tree.has_value() || a->draft->broken() || !WaitsForDraft(*a) || now >= deadline) {
        ready.push_back(a.get());  // a tree, or fail open: verify without one
        continue;
      }
      next_deadline = std::min(next_deadline, deadline);
    }
    // Verify once at least half the running set is ready; the others keep being drafted
    // meanwhile, so the drafter and the verifier work at the same time (DESIGN §2).
    if (shutdown_ || !cancelled_.empty() ||
        (!ready.empty() && 2 * ready.size() >= running_.size())) {
      return ready;
    }
    // A queued request that could be admitted: nothing yet, so that the caller admits it and
    // its prefill joins the next step, which still waits for half the running set. (Returning
    // the few requests ready so far split the batch: at 64 requests of the 8B a new one
    // arrives about every tree step, and each such step verified a fraction of the batch for a
    // whole step's weight reads.)
    auto admissible = [&] { return FrontPagesIfAdmissible() > 0; };
    if (admissible()) return {};
    const int64_t seen = draft_events_;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(next_deadline - now), [&] {
      return shutdown_ || draft_events_ != seen || !cancelled_.empty() || admissible();
    });
  }
}

void Engine::PlanPrefill(std::vector<Active*>& members) {
  const int chunk = options_.prefill_chunk;
  int budget = chunk > 0 ? chunk : std::numeric_limits<int>::max();
  int chunks = 0;
  // Takes a prefilling member's next chunk out of the budget, or says it sits this step out.
  auto sits_out = [&](Active* a) {
    if (a->prefilled) return false;
    const int prompt = static_cast<int>(a->request.prompt.size());
    const int end = chunk > 0 ? std::min(prompt, (a->committed_len / chunk + 1) * chunk) : prompt;
    if (end - a->committed_len > budget) return true;
    budget -= end - a->committed_len;
    a->chunk_end = end;
    ++chunks;
    return false;
  };
  members.erase(std::remove_if(members.begin(), members.end(), sits_out), members.end());
  if (chunks == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++prefill_steps_;
  prefill_chunks_ += chunks;
}

bool Engine::Step(const std::vector<Active*>& members) {
  const absl::Time step_start = absl::Now();
  const bool verify_only =
      std::all_of(members.begin(), members.end(), [](const Active* a) { return a->prefilled; });
  std::vector<SeqTree> batch = BuildBatch(members);
  const absl::Time forward_start = absl::Now();
  absl::StatusOr<std::vector<StepResult>> results = RunBatch(members, batch);
  const absl::Time forward_end = absl::Now();
  if (!results.ok()) {
    FailStep(members, results.status());
    return !verify_only;
  }
  const StepTiming timing{absl::ToDoubleMilliseconds(forward_start - step_start),
                          absl::ToDoubleMilliseconds(forward_end - forward_start), forward_end};
  // A prefilled prompt's cost does not depend on the gate's arm: the gate scores the step
  // without it, as the model prices it. What the model does not foresee stays in: a step that
  // prefills one prompt beside a batch's trees can cost more than its prediction (its rows run
  // in the next graph bucket), and in a closed loop trees, which end requests at different
  // steps, prefill prompts one or two at a time where plain steps, in lockstep, took a whole
  // wave in one step.
  double prompt_ms = 0;
  if (step_cost_.has_value()) {
    const StepShape shape = ShapeOf(members, batch, /*verify_members_only=*/false);
    if (verify_only) {
      ObserveStepCost(shape, timing.forward_ms);
    } else if (options_.speculation_gate) {
      prompt_ms = step_cost_->PromptsMs(shape, ShapeOf(members, batch, true));
    }
  }
  ObserveGate(members, *results, prompt_ms, forward_end);
  for (size_t b = 0; b < members.size(); ++b) {
    ApplyResult(*members[b], batch[b], std::move((*results)[b]), timing);
  }
  return !verify_only;
}

void Engine::ObserveGate(const std::vector<Active*>& members,
                         const std::vector<StepResult>& results, double prompt_ms, absl::Time end) {
  const absl::Time previous_end = std::exchange(last_step_end_, end);
  if (!options_.speculation_gate) return;
  // The prompts' cost as priced comes off the step's interval: scored whole, one prompt (tens
  // of decode steps' time on the CPU), which an epoch catches or misses by chance, made the
  // arms' figures swing by more than their difference.
  const absl::Time start = previous_end + absl::Milliseconds(prompt_ms);
  // The gated requests of each drafter kind in the step (almost always one kind).
  struct KindStep {
    DraftSourceKind kind;
    int tokens = 0;
    std::vector<SpeculationGate::Choice> choices;
  };
  std::vector<KindStep> kinds;
  for (size_t b = 0; b < members.size(); ++b) {
    const Active& a = *members[b];
    // A prompt prefilled here chose no arm, and its token is what either arm would give it.
    if (!a.request.auto_tree_budget || !a.speculates() || !a.prefilled) continue;
    const DraftSourceKind kind = a.request.spec_mode.kind();
    auto it =
        std::find_if(kinds.begin(), kinds.end(), [&](const KindStep& k) { return k.kind == kind; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), KindStep{kind});
    it->tokens += static_cast<int>(results[b].emitted.size());
    it->choices.push_back({a.tree_asked, a.chose_at});
  }
  if (kinds.empty()) return;
  const int running = static_cast<int>(running_.size());
  // The most plain steps could deliver at this load: a token per request per predicted forward.
  double plain_bound = 0;
  if (step_cost_.has_value() && running > 0) {
    double context = 0;
    for (const auto& a : running_) context += a->committed_len;
    plain_bound = running / step_cost_->PredictMs({running, 0, context / running});
  }
  for (const KindStep& k : kinds) {
    const SpeculationGate::Observed observed =
        gate_.ObserveStep(k.kind, running, k.choices, k.tokens, start, end, plain_bound);
    if (observed != SpeculationGate::Observed::kNone) {
      TS_LOG(kDebug, "speculation gate %s: %s",
             observed == SpeculationGate::Observed::kSwitch ? "switch" : "epoch",
             gate_.Describe(k.kind, running));
    }
  }
}

StepShape Engine::ShapeOf(const std::vector<Active*>& members, const std::vector<SeqTree>& batch,
                          bool verify_members_only) {
  int n = 0;
  int64_t drafted = 0, context = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    if (verify_members_only && !members[b]->prefilled) continue;
    ++n;
    drafted += static_cast<int64_t>(batch[b].tokens.size()) - 1;
    context += batch[b].committed_len;
  }
  if (n == 0) return {};
  return {n, static_cast<double>(drafted) / n, static_cast<double>(context) / n};
}

void Engine::ObserveStepCost(const StepShape& shape, double forward_ms) {
  const double predicted = step_cost_->PredictMs(shape);
  step_cost_->Observe(shape, forward_ms);
  const double ratio = forward_ms / predicted;
  const auto& bounds = StepCostStats::kRatioBounds;
  const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), ratio) - bounds.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++step_cost_stats_.steps;
  step_cost_stats_.predicted_ms += predicted;
  step_cost_stats_.measured_ms += forward_ms;
  step_cost_stats_.ratio_sum += ratio;
  if (bucket < bounds.size()) ++step_cost_stats_.ratio_counts[bucket];
}

std::vector<SeqTree> Engine::BuildBatch(const std::vector<Active*>& members) {
  std::vector<DraftedTree> drafts(members.size());
  bool any_tree = false;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i]->prefilled) {
      drafts[i] = TakeDraft(*members[i]);
      any_tree = any_tree || !drafts[i].tokens.empty();
    }
  }
  if (step_cost_.has_value() && any_tree) SelectTrees(members, drafts);
  std::vector<SeqTree> batch;
  batch.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    Active* a = members[i];
    SeqTree t;
    t.seq = a->seq;
    t.committed_len = a->committed_len;
    if (!a->prefilled) {
      // The prompt's next chunk (after its cached prefix) is one chain tree beside the other
      // requests' verify trees.
      t.tokens.assign(a->request.prompt.begin() + a->committed_len,
                      a->request.prompt.begin() + a->chunk_end);
      t.parents.resize(t.tokens.size());
      std::iota(t.parents.begin(), t.parents.end(), -1);
    } else {
      ToVerifyTree(a->bonus, drafts[i], &t.tokens, &t.parents);
      // Never write past the context window: a prefix of the nodes is still a tree.
      const int room = options_.context_length - a->committed_len;
      if (static_cast<int>(t.tokens.size()) > room) {
        t.tokens.resize(room);
        t.parents.resize(room);
      }
    }
    batch.push_back(std::move(t));
  }
  return batch;
}

void Engine::SelectTrees(const std::vector<Active*>& members, std::vector<DraftedTree>& drafts) {
  std::vector<SelectionCandidate> candidates;
  std::vector<size_t> member_of;  // candidate -> index into members
  PrefillLoad prefill;
  for (size_t i = 0; i < members.size(); ++i) {
    const Active& a = *members[i];
    if (!a.prefilled) {
      ++prefill.sequences;
      prefill.rows += a.chunk_end - a.committed_len;
      continue;
    }
    candidates.push_back(
        {&drafts[i], a.committed_len, a.request.spec.tree_budget, a.request.spec_mode.kind()});
    member_of.push_back(i);
  }
  const TreeSelection chosen = SelectNodes(candidates, *step_cost_, calibration_, prefill);
  int drafted = 0, kept = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const size_t i = member_of[c];
    Active& a = *members[i];
    drafted += static_cast<int>(drafts[i].tokens.size());
    kept += static_cast<int>(chosen.keep[c].size());
    if (a.draft == nullptr) continue;
    a.selected = true;
    a.offered_nodes = static_cast<int>(drafts[i].tokens.size());
    a.expected_accepted = chosen.expected[c];
    a.kept_depths = chosen.kept_depths[c];
    a.kept_probs = chosen.kept_probs[c];
    drafts[i] = KeepNodes(drafts[i], chosen.keep[c]);
  }
  TS_LOG(kDebug,
         "selection: %d requests (+%d prefills), %d of %d drafted nodes kept, %.2f tokens in "
         "%.3f ms",
         static_cast<int>(candidates.size()), prefill.sequences, kept, drafted,
         chosen.expected_tokens, chosen.predicted_ms);
}

DraftedTree Engine::TakeDraft(Active& a) {
  DraftedTree drafted;
  if (!a.tree_asked) return drafted;
  if (a.tree.has_value()) {
    absl::Status valid = ValidateDraftedTree(*a.tree, model_->config().vocab_size,
                                             a.request.spec.tree_budget, a.request.spec.max_depth);
    if (valid.ok()) {
      drafted = std::move(*a.tree);
    } else if (a.stats.bad_trees++ == 0) {
      TS_LOG(kWarning,
             "request %s step %d: dropping bad draft tree: %s (further ones for this request "
             "are counted, not logged)",
             a.request.id, a.step, std::string(valid.message()));
    } else {
      TS_LOG(kDebug, "request %s step %d: dropping bad draft tree: %s", a.request.id, a.step,
             std::string(valid.message()));
    }
    a.timeouts = 0;
  } else if (a.draft != nullptr && !a.draft->broken()) {
    ++a.timeouts;  // a slow drafter; a broken session is not, and is reopened instead
  }
  if (a.draft != nullptr) a.stats.bad_trees += a.draft->TakeMisnumberedTrees();
  a.tree.reset();
  return drafted;
}

absl::StatusOr<std::vector<StepResult>> Engine::RunBatch(const std::vector<Active*>& members,
                                                         const std::vector<SeqTree>& batch) {
  std::vector<StepSpec> specs(members.size());
  for (size_t b = 0; b < members.size(); ++b) {
    specs[b].sampling = members[b]->request.sampling;
    specs[b].prefill = !members[b]->prefilled;
    specs[b].capture_features = members[b]->captures();
  }
  return model_->VerifyStep(batch, specs);
}

void Engine::FailStep(const std::vector<Active*>& members, const absl::Status& status) {
  TS_LOG(kError, "verify step of %d requests failed: %s", static_cast<int>(members.size()),
         std::string(status.message()));
  for (Active* a : members) {
    GenerationUpdate update;
    update.finished = true;
    update.status = absl::InternalError(absl::StrCat("verify step failed: ", status.message()));
    Finish(*a, std::move(update));
  }
}

void Engine::RecordSpecStats(Active& a, const SeqTree& t, int accepted) {
  SpecStats& s = a.stats;
  const int n = static_cast<int>(t.tokens.size());
  ++s.steps;
  s.drafted_tokens += n - 1;
  s.accepted_tokens += accepted;
  if (n == 1) ++s.fallback_steps;
  const std::vector<int32_t> depth = NodeDepths(t.parents);
  const int deepest = *std::max_element(depth.begin(), depth.end());
  for (int d = 0; d < deepest && d < static_cast<int>(s.drafted_per_depth.size()); ++d) {
    ++s.drafted_per_depth[d];
  }
  for (int d = 0; d < accepted && d < static_cast<int>(s.accepted_per_depth.size()); ++d) {
    ++s.accepted_per_depth[d];
  }
}

void Engine::ApplyResult(Active& a, const SeqTree& t, StepResult result, const StepTiming& timing) {
  a.stats.forward_ms += timing.forward_ms;
  a.stats.host_ms += timing.build_ms;
  if (!a.prefilled) {
    a.committed_len += static_cast<int>(t.tokens.size());
    // The prompt's pages are final: a request with the same prefix admitted while this one
    // still runs shares them.
    if (options_.prefix_cache) {
      model_->kv_cache().CachePages(a.seq,
                                    absl::MakeConstSpan(a.context).subspan(0, a.committed_len));
    }
    if (a.committed_len < static_cast<int>(a.request.prompt.size())) {
      // A chunk before the prompt's end: the target's choice after it is not a token of the
      // output; its features wait for the first bonus.
      a.prefill_features.Append(result.features);
      a.stats.host_ms += absl::ToDoubleMilliseconds(absl::Now() - timing.forward_end);
      return;
    }
    if (a.prefill_features.rows > 0) {
      a.prefill_features.Append(result.features);
      result.features = std::exchange(a.prefill_features, TargetFeatures{});
    }
  }
  std::vector<int32_t> emitted = std::move(result.emitted);
  a.context.insert(a.context.end(), emitted.begin(), emitted.end());
  if (!a.prefilled) {
    a.prefilled = true;
    a.step = 0;  // the drafter's first tree answers commit 0 (the first bonus)
  } else {
    const int accepted = static_cast<int>(result.path.size()) - 1;
    a.committed_len += accepted + 1;
    ++a.step;
    // Every request's steps count, speculation off included (each a step without a draft), so
    // its mean acceptance length is 1.0 rather than undefined.
    RecordSpecStats(a, t, accepted);
    if (a.selected) {
      calibration_.Observe(a.request.spec_mode.kind(), a.kept_depths, a.kept_probs, accepted);
      a.selected = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        SelectionCounts& counts = step_cost_stats_.Of(a.request.spec_mode.kind());
        counts.drafted_nodes += a.offered_nodes;
        counts.verified_nodes += static_cast<int64_t>(a.kept_depths.size());
        counts.expected_accepted += a.expected_accepted;
        counts.accepted += accepted;
      }
      if (a.request.auto_tree_budget) {
        a.ask_budget =
            NextTreeBudget(a.ask_budget, a.offered_nodes, static_cast<int>(a.kept_depths.size()),
                           a.request.spec.tree_budget);
        last_ask_budget_[DraftSourceIndex(a.request.spec_mode.kind())] = a.ask_budget;
      }
    }
  }
  a.bonus = emitted.back();
  GenerationUpdate update = a.output->Append(emitted);
  if (!update.finished && a.committed_len >= options_.context_length) {
    GenerationUpdate last = a.output->Finish(FinishReason::kContext);
    update.text += last.text;
    update.finished = true;
    update.finish_reason = FinishReason::kContext;
  }
  a.stats.host_ms += absl::ToDoubleMilliseconds(absl::Now() - timing.forward_end);
  if (update.finished) {
    Finish(a, std::move(update));
    return;
  }
  a.sink->OnUpdate(std::move(update));
  if (a.speculates()) {
    if (!a.feature_layers.empty() && a.draft == nullptr && !a.captures()) a.plain_only = true;
    a.chose_at = timing.forward_end;
    CommitToDrafter(a, std::move(emitted), std::move(result.features));
  }
}

void Engine::CommitToDrafter(Active& a, std::vector<int32_t> emitted, TargetFeatures features) {
  DraftContext added{std::move(emitted),
                     SelectLayers(std::move(features), model_->feature_layers(), a.feature_layers,
                                  model_->config().hidden_size)};
  int budget = 0;  // the session's
  if (a.request.auto_tree_budget) {
    a.tree_asked = !a.plain_only &&
                   (!options_.speculation_gate ||
                    gate_.WantsTree(a.request.spec_mode.kind(), static_cast<int>(running_.size())));
    budget = a.tree_asked ? a.ask_budget : DraftStream::kNoTree;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SelectionCounts& counts = step_cost_stats_.Of(a.request.spec_mode.kind());
      ++(a.tree_asked ? counts.auto_tree_steps : counts.auto_plain_steps);
    }
    if (a.plain_only) {
      a.deferred = DraftContext{};
      return;
    }
  }
  // Commits concatenate (each carries the rows of its tokens but the last, draft_context.h).
  if (a.deferred.tokens.empty()) {
    a.deferred = std::move(added);
  } else {
    a.deferred.tokens.insert(a.deferred.tokens.end(), added.tokens.begin(), added.tokens.end());
    a.deferred.features.Append(added.features);
  }
  // Without a tree the context waits, up to kMaxDeferredTokens, so that the drafter never lags
  // far (nor closes the session as idle) and a tree asked later catches up in one commit.
  if (!a.tree_asked && static_cast<int>(a.deferred.tokens.size()) < kMaxDeferredTokens) return;
  if (a.unopened.has_value()) {
    OpenDraft(a, *a.unopened);
    a.unopened.reset();
    if (a.draft == nullptr) {  // the source could not open one: the request runs plain
      a.deferred = DraftContext{};
      return;
    }
  }
  a.commit_sent = absl::Now();
  a.draft->Commit(a.step, std::exchange(a.deferred, DraftContext{}), budget);
}

void Engine::Finish(Active& a, GenerationUpdate update) {
  update.prompt_tokens = static_cast<int>(a.request.prompt.size());
  update.cached_tokens = a.cached_tokens;
  update.cache_queried_tokens = a.cache_queried ? update.prompt_tokens : 0;
  update.completion_tokens = a.output ? a.output->completion_tokens() : 0;
  update.stats = a.stats;
  update.elapsed_ms = absl::ToDoubleMilliseconds(absl::Now() - a.start);
  if (update.status.ok()) {
    const double secs = update.elapsed_ms / 1e3;
    TS_LOG(kInfo,
           "request %s done: %s, prompt %d, completion %d tokens, %.1f ms, %.1f tok/s, steps %d, "
           "mean acceptance %.2f",
           a.request.id, FinishReasonName(update.finish_reason), update.prompt_tokens,
           update.completion_tokens, update.elapsed_ms,
           secs > 0 ? update.completion_tokens / secs : 0.0, static_cast<int>(a.stats.steps),
           a.stats.MeanAcceptanceLength());
  } else {
    TS_LOG(kWarning, "request %s failed: %s", a.request.id, std::string(update.status.message()));
  }
  a.sink->OnUpdate(std::move(update));
  Release(a);
}

void Engine::Release(Active& a) {
  if (a.done) return;
  a.done = true;
  if (a.seq != 0) {
    // Its committed tokens' K/V are final: the full pages of them stay for later requests
    // (a conversation's next turn holds this prompt and this answer).
    if (options_.prefix_cache) {
      model_->kv_cache().CachePages(a.seq,
                                    absl::MakeConstSpan(a.context).subspan(0, a.committed_len));
    }
    model_->FreeSequence(a.seq);
  }
  a.draft.reset();
  a.unopened.reset();
  a.sink.reset();
}

void Engine::RemoveFinished() {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Active>& a) { return a->done; }),
                 running_.end());
  std::lock_guard<std::mutex> lock(mu_);
  running_count_ = static_cast<int>(running_.size());
}

}  // namespace treespec
