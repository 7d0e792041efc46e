#include "server/metrics/metrics.h"

#include <utility>

#include "prometheus/text_serializer.h"
#include "server/metrics/process_metrics.h"

namespace syncnorm {

Metrics::Metrics(const Limits& limits)
    : registry_(std::make_shared<prometheus::Registry>()),
      grpc_(*registry_),
      rounds_(*registry_),
      load_(limits) {}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(
    const std::string& listen, const Limits& limits, MetricsHttpOptions http) {
  auto metrics = std::unique_ptr<Metrics>(new Metrics(limits));
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          listen, [m = metrics.get()] { return m->Render(); }, http);
  if (!server.ok()) return server.status();
  metrics->http_ = *std::move(server);
  metrics->port_ = metrics->http_->port();
  return metrics;
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : load_.Collect()) {
    families.push_back(std::move(f));
  }
  for (prometheus::MetricFamily& f : CollectProcessMetrics()) {
    families.push_back(std::move(f));
  }
  return prometheus::TextSerializer().Serialize(families);
}

std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
Metrics::NewInterceptorFactories() {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      out;
  out.push_back(grpc_.NewInterceptorFactory());
  return out;
}

}  // namespace syncnorm
