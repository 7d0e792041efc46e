// The aggregator binary watched as deploy/monitoring watches it: Debian's
// Prometheus scrapes it every second and evaluates a copy of
// deploy/monitoring/syncnorm-alerts.yaml every second, with every `for:`
// set to 0s so that an alert fires on the evaluation after its condition
// holds (the `for:` durations as written are promtool's to test:
// deploy:monitoring_rules_test).
#ifndef SYNCNORM_TESTS_TESTING_MONITORED_AGGREGATOR_H_
#define SYNCNORM_TESTS_TESTING_MONITORED_AGGREGATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster.h"
#include "tests/testing/prometheus_server.h"

namespace syncnorm::testing {

// The path of deploy/monitoring/<name> among the test's runfiles.
std::string MonitoringFile(const std::string& name);

// An alerting rule as Prometheus loaded and evaluated it.
struct LoadedAlert {
  std::string name;
  std::string query;
};

class MonitoredAggregator {
 public:
  struct Options {
    // More flags of the aggregator (it has --metrics_listen and a data dir).
    std::vector<std::string> aggregator_flags;
    // More targets of the aggregator's scrape job.
    std::vector<ScrapeTarget> more_targets;
    // A rule file of the test's own (YAML text), loaded beside the alerts;
    // empty: none.
    std::string more_rules;
  };

  // Starts the aggregator in `dir` and Prometheus beside it, and returns
  // once Prometheus has scraped the aggregator (its series carry
  // namespace="syncnorm" and pod="syncnorm-aggregator-0", as a
  // ServiceMonitor's would).
  static absl::StatusOr<std::unique_ptr<MonitoredAggregator>> Start(
      const std::string& dir, const Options& options);

  AggregatorProcess& aggregator() { return *aggregator_; }
  PrometheusServer& prometheus() { return *prometheus_; }
  int metrics_port() const { return metrics_port_; }

  // The alerts of syncnorm-alerts.yaml as Prometheus loaded them, once each
  // has been evaluated; INVALID_ARGUMENT naming one whose evaluation failed
  // (with Prometheus's error), or whose name is not the file's;
  // DEADLINE_EXCEEDED when one is still unevaluated at `deadline`.
  absl::StatusOr<std::vector<LoadedAlert>> EvaluatedAlerts(absl::Time deadline);

  // The series ALERTS{alertname=`alert`, alertstate="firing"} once there is
  // one (the alert fires), or DEADLINE_EXCEEDED.
  absl::StatusOr<nlohmann::json> AwaitFiring(absl::string_view alert,
                                             absl::Time deadline);

  // Stops Prometheus, then the aggregator; the aggregator's exit code.
  absl::StatusOr<int> Stop();

 private:
  MonitoredAggregator() = default;

  std::unique_ptr<AggregatorProcess> aggregator_;
  std::unique_ptr<PrometheusServer> prometheus_;
  int metrics_port_ = 0;
  std::vector<std::string> file_alerts_;  // the names in the rule file
};

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_MONITORED_AGGREGATOR_H_
