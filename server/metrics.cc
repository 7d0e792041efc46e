#include "server/metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace syncnorm {

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      grpc_(*registry_),
      rounds_(*registry_) {}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(
    const std::string& listen) {
  auto metrics = std::unique_ptr<Metrics>(new Metrics());
  try {
    // civetweb: one listening thread plus two workers are plenty for a
    // scrape every few seconds.
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on --metrics_listen='", listen, "': ", e.what(),
        "; check that it is HOST:PORT and that the port is free"));
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  metrics->port_ = ports.empty() ? 0 : ports[0];
  return metrics;
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
