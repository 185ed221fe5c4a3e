// The drafter's Prometheus metrics (issue 4), served over HTTP by the binary (--metrics_port):
//   treespec_drafter_sessions_active (gauge), treespec_drafter_sessions_total,
//   treespec_drafter_sessions_reaped_total (ended after --session_idle_timeout_s of silence),
//   treespec_drafter_trees_total, treespec_drafter_tree_nodes_total,
//   treespec_drafter_stale_steps_total (commits superseded before their tree was drafted),
//   treespec_drafter_tree_build_seconds (histogram: append a commit + draft its tree, on the
//   worker thread),
//   treespec_drafter_queued_trees (gauge: sessions whose next tree waits for a drafting thread),
//   treespec_drafter_tree_queue_seconds (histogram: that wait, per tree),
//   treespec_drafter_prefix_cache_{queried,hit}_tokens_total{kind} (prompt tokens of sessions
//   whose drafter has a prefix cache, looked up / reused from it).
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFTER_METRICS_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFTER_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/tree/drafter_kind.h"

namespace treespec {

class DrafterMetrics final : public prometheus::Collectable {
 public:
  DrafterMetrics();

  void OnSessionOpened();
  void OnSessionClosed();
  // A session was ended because its verifier stayed silent past the idle timeout.
  void OnSessionReaped();
  void OnTreeBuilt(double seconds, int nodes);
  void OnStaleStep();
  // A session's next tree was handed to the drafting threads / a thread took it after waiting
  // `waited_seconds`.
  void OnTreeQueued();
  void OnTreeDequeued(double waited_seconds);
  // A session of `kind` looked its prompt of `queried` tokens up in its prefix cache and
  // reused `hit` of them.
  void OnPrefixLookup(DrafterKind kind, int queried, int hit);

  // prometheus::Collectable: the counters and histograms, then the two gauges.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The text exposition of Collect(), as /metrics serves it.
  std::string Scrape() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<int> active_{0};
  std::atomic<int> queued_{0};
  prometheus::Counter* sessions_;
  prometheus::Counter* sessions_reaped_;
  prometheus::Counter* trees_;
  prometheus::Counter* tree_nodes_;
  prometheus::Counter* stale_steps_;
  prometheus::Histogram* build_seconds_;
  prometheus::Histogram* queue_seconds_;
  prometheus::Family<prometheus::Counter>* cache_queried_;
  prometheus::Family<prometheus::Counter>* cache_hit_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFTER_METRICS_H_
