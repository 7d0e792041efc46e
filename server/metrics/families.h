// Metric families built by hand, for the values read at each scrape
// (LoadMetrics, CollectProcessMetrics) rather than kept in the registry.
#ifndef SYNCNORM_SERVER_METRICS_FAMILIES_H_
#define SYNCNORM_SERVER_METRICS_FAMILIES_H_

#include <string>
#include <utility>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace syncnorm {

// A family with no samples yet.
inline prometheus::MetricFamily NewFamily(std::string name, std::string help,
                                          prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

// One sample of `family`: its gauge's or its counter's value, by the
// family's type.
inline void AddSample(
    prometheus::MetricFamily& family, double value,
    std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric sample;
  sample.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
  family.metric.push_back(std::move(sample));
}

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_FAMILIES_H_
