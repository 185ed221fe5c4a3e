#include "common/metrics/exposition.h"

#include <prometheus/text_serializer.h>

#include <utility>

namespace treespec {

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

namespace {

prometheus::MetricFamily OneValueFamily(const std::string& name, const std::string& help,
                                        prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help,
                                     double value) {
  return OneValueFamily(name, help, prometheus::MetricType::Gauge, value);
}

prometheus::MetricFamily CounterFamily(const std::string& name, const std::string& help,
                                       double value) {
  return OneValueFamily(name, help, prometheus::MetricType::Counter, value);
}

prometheus::MetricFamily CounterFamily(const std::string& name, const std::string& help,
                                       const std::string& label,
                                       const std::vector<std::pair<std::string, double>>& series) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Counter;
  for (const auto& [label_value, value] : series) {
    prometheus::ClientMetric metric;
    metric.label.push_back({label, label_value});
    metric.counter.value = value;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

std::string TextExposition(const prometheus::Collectable& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.Collect());
}

}  // namespace treespec
