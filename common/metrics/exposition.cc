#include "common/metrics/exposition.h"

#include <prometheus/text_serializer.h>

#include <utility>

namespace treespec {

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help,
                                     double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
  return family;
}

std::string TextExposition(const prometheus::Collectable& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.Collect());
}

}  // namespace treespec
