#include "drafter_service/drafter_metrics.h"

#include "common/metrics/exposition.h"

namespace treespec {

DrafterMetrics::DrafterMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto counter = [&](const std::string& name, const std::string& help) {
    return &AddCounter(*registry_, name, help);
  };
  sessions_ = counter("treespec_drafter_sessions_total", "Draft sessions opened");
  sessions_reaped_ = counter("treespec_drafter_sessions_reaped_total",
                             "Draft sessions ended because their verifier stayed silent");
  trees_ = counter("treespec_drafter_trees_total", "Draft trees sent");
  tree_nodes_ = counter("treespec_drafter_tree_nodes_total", "Nodes of the draft trees sent");
  stale_steps_ = counter("treespec_drafter_stale_steps_total",
                         "Commits superseded by a newer one before their tree was drafted");
  // 50 µs .. ~0.8 s in powers of two: a tree of an n-gram drafter to one of a large draft model.
  prometheus::Histogram::BucketBoundaries buckets;
  for (double s = 50e-6; s < 1.0; s *= 2) buckets.push_back(s);
  build_seconds_ = &prometheus::BuildHistogram()
                        .Name("treespec_drafter_tree_build_seconds")
                        .Help("Time to append a commit and draft its tree, on the worker thread")
                        .Register(*registry_)
                        .Add({}, buckets);
  cache_queried_ = &prometheus::BuildCounter()
                        .Name("treespec_drafter_prefix_cache_queried_tokens_total")
                        .Help("Prompt tokens of sessions looked up in the drafter's prefix cache")
                        .Register(*registry_);
  cache_hit_ = &prometheus::BuildCounter()
                    .Name("treespec_drafter_prefix_cache_hit_tokens_total")
                    .Help("Prompt tokens of sessions reused from the drafter's prefix cache")
                    .Register(*registry_);
  queue_seconds_ = &prometheus::BuildHistogram()
                        .Name("treespec_drafter_tree_queue_seconds")
                        .Help("Wait of a session's next tree for a drafting thread")
                        .Register(*registry_)
                        .Add({}, buckets);
}

void DrafterMetrics::OnSessionOpened() {
  ++active_;
  sessions_->Increment();
}

void DrafterMetrics::OnSessionClosed() { --active_; }

void DrafterMetrics::OnSessionReaped() { sessions_reaped_->Increment(); }

void DrafterMetrics::OnPrefixLookup(DrafterKind kind, int queried, int hit) {
  const std::map<std::string, std::string> labels = {{"kind", DrafterKindName(kind)}};
  cache_queried_->Add(labels).Increment(queried);
  cache_hit_->Add(labels).Increment(hit);
}

void DrafterMetrics::OnTreeBuilt(double seconds, int nodes) {
  build_seconds_->Observe(seconds);
  trees_->Increment();
  tree_nodes_->Increment(nodes);
}

void DrafterMetrics::OnStaleStep() { stale_steps_->Increment(); }

void DrafterMetrics::OnTreeQueued() { ++queued_; }

void DrafterMetrics::OnTreeDequeued(double waited_seconds) {
  --queued_;
  queue_seconds_->Observe(waited_seconds);
}

std::vector<prometheus::MetricFamily> DrafterMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  families.push_back(
      GaugeFamily("treespec_drafter_sessions_active", "Draft sessions open now", active_.load()));
  families.push_back(GaugeFamily("treespec_drafter_queued_trees",
                                 "Sessions whose next tree waits for a drafting thread",
                                 queued_.load()));
  return families;
}

std::string DrafterMetrics::Scrape() const { return TextExposition(*this); }

}  // namespace treespec
