// Small pieces the services' Prometheus metrics share (verifier_service/serving_metrics.h,
// drafter_service/drafter_metrics.h) and the HTTP server that serves them.
#ifndef TREESPEC_COMMON_METRICS_EXPOSITION_H_
#define TREESPEC_COMMON_METRICS_EXPOSITION_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <string>
#include <utility>
#include <vector>

namespace treespec {

// The unlabelled counter `name` in `registry`.
prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help);

// A family of one unlabelled gauge, or counter, for values read at scrape time (not kept in a
// registry).
prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help,
                                     double value);
prometheus::MetricFamily CounterFamily(const std::string& name, const std::string& help,
                                       double value);
// A counter family with one series per (label value, value) of `series`, labelled `label`.
prometheus::MetricFamily CounterFamily(const std::string& name, const std::string& help,
                                       const std::string& label,
                                       const std::vector<std::pair<std::string, double>>& series);

// The Prometheus text exposition of everything `metrics` collects (what GET /metrics returns).
std::string TextExposition(const prometheus::Collectable& metrics);

}  // namespace treespec

#endif  // TREESPEC_COMMON_METRICS_EXPOSITION_H_
