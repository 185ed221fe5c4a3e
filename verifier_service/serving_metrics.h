// The verifier's Prometheus metrics (issue 4), served over HTTP by the binary (--metrics_port)
// and read in tests through Scrape(). Names follow Prometheus conventions (base units, _total
// for counters, _seconds for times).
//   gauges, read from the engine at scrape time:
//     treespec_requests_running, treespec_requests_queued,
//     treespec_kv_cache_pages, treespec_kv_cache_utilization (used / all pages, 0..1; pages
//     only the prefix cache holds count as unused: they are evicted on demand),
//     treespec_prefix_cache_pages (pages in the prefix cache, held or not),
//     treespec_prefix_cache_evicted_pages_total (counter: cached pages evicted for new ones)
//   with a step-cost model (EngineOptions::step_cost), also read at scrape time:
//     treespec_step_cost_ratio (histogram of measured / predicted forward time per verify
//       step: its median is the model's bias), treespec_step_cost_predicted_seconds_total and
//       treespec_step_cost_measured_seconds_total (the same steps' times summed),
//     by drafter kind (label kind: ngram, draft_model, dflash, replay, or auto for sessions of
//     mode AUTO): treespec_selection_drafted_nodes_total,
//       treespec_selection_verified_nodes_total (drafted nodes that arrived, and those the tree
//       selection verified),
//       treespec_selection_expected_accepted_tokens_total and
//       treespec_selection_accepted_tokens_total (what it expected them to accept, and did),
//     treespec_auto_tree_steps_total and treespec_auto_plain_steps_total (auto-budget
//       requests' steps with a tree asked for, and without: SpeculationGate)
//   histograms: treespec_time_to_first_token_seconds, treespec_inter_token_latency_seconds
//     (the gap between two stream messages that brought tokens),
//     treespec_drafter_round_trip_seconds (a commit sent to the drafter until its tree arrives)
//   counters, added as it happens: treespec_drafter_session_reopens_total (attempts to reopen
//     a request's drafter session after it broke; backoff-limited)
//   counters, added when a request ends:
//     treespec_requests_total{reason} (finish reason, or "error"),
//     treespec_prompt_tokens_total, treespec_generation_tokens_total,
//     treespec_prefix_cache_queried_tokens_total, treespec_prefix_cache_hit_tokens_total
//       (prompt tokens looked up in the prefix cache, and those reused from it),
//     treespec_verify_step_seconds_total{part = draft_wait | forward | host} (each request's
//       steps, so a batched step counts once per request in it),
//     treespec_spec_verify_steps_total, treespec_spec_fallback_steps_total (steps without a
//       usable draft), treespec_spec_drafts_total (= verify steps - fallback steps),
//     treespec_spec_draft_tokens_total, treespec_spec_accepted_tokens_total,
//     treespec_spec_accepted_tokens_by_depth_total{depth}, treespec_spec_bad_trees_total.
// Mean acceptance length per verify step = 1 + accepted / verify steps (the engine's figure);
// per drafted step = 1 + accepted / drafts.
#ifndef TREESPEC_VERIFIER_SERVICE_SERVING_METRICS_H_
#define TREESPEC_VERIFIER_SERVICE_SERVING_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "verifier_service/engine.h"
#include "verifier_service/request.h"

namespace treespec {

class ServingMetrics final : public prometheus::Collectable {
 public:
  // `snapshot` gives the gauges at every scrape (from any thread).
  explicit ServingMetrics(std::function<EngineSnapshot()> snapshot);

  // A request's first tokens reached the stream `seconds` after the request arrived.
  void ObserveTimeToFirstToken(double seconds);
  // Tokens reached the stream `seconds` after the previous ones of the same request.
  void ObserveInterTokenLatency(double seconds);
  // A draft tree arrived `seconds` after the commit it answers was sent.
  void ObserveDrafterRoundTrip(double seconds);
  // An attempt to reopen a request's drafter session that broke.
  void OnDraftSessionReopened();
  // A request ended with `final_update` (finished set).
  void OnFinished(const GenerationUpdate& final_update);

  // prometheus::Collectable: the counters and histograms, then the gauges.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The text exposition of Collect(), as /metrics serves it.
  std::string Scrape() const;

 private:
  std::function<EngineSnapshot()> snapshot_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* drafter_rtt_;
  prometheus::Counter* session_reopens_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* cache_queried_tokens_;
  prometheus::Counter* cache_hit_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Family<prometheus::Counter>* step_seconds_;
  prometheus::Counter* verify_steps_;
  prometheus::Counter* fallback_steps_;
  prometheus::Counter* drafts_;
  prometheus::Counter* draft_tokens_;
  prometheus::Counter* accepted_tokens_;
  prometheus::Family<prometheus::Counter>* accepted_by_depth_;
  prometheus::Counter* bad_trees_;
};

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_SERVING_METRICS_H_
