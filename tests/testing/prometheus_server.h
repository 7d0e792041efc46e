// Debian's Prometheus server (/usr/bin/prometheus) on loopback, for system
// tests of the metrics, the dashboard and the alerting rules: it scrapes
// the targets it is given and evaluates the rule files every interval, and
// the test reads it back through its HTTP API.
#ifndef SYNCNORM_TESTS_TESTING_PROMETHEUS_SERVER_H_
#define SYNCNORM_TESTS_TESTING_PROMETHEUS_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {

// One scrape target and the labels Prometheus adds to its series.
struct ScrapeTarget {
  std::string address;  // host:port, scraped at /metrics
  std::map<std::string, std::string> labels;
};

struct PrometheusOptions {
  std::string job = "syncnorm-aggregator";  // the scrape job of the targets
  std::vector<ScrapeTarget> targets;
  std::vector<std::string> rule_files;  // paths
  // Scrape and rule evaluation interval.
  absl::Duration interval = absl::Seconds(1);
};

// A started Prometheus. Not thread-safe. The destructor kills it.
class PrometheusServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/prometheus";

  // Whether kBinary is there (scripts/deps.sh installs it).
  static bool Installed();

  // Writes <dir>/prometheus.yml, starts Prometheus on a free loopback port
  // with its data in <dir>/tsdb and its log in <dir>/prometheus.log, and
  // returns once its API answers (at most 30 s); UNAVAILABLE with the log
  // otherwise.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const PrometheusOptions& options);

  int port() const { return port_; }
  std::string log() const;

  // GET /api/v1/<path_and_query> (the query's values already URL-encoded):
  // the answer's "data" when its status is "success"; INVALID_ARGUMENT
  // with Prometheus's errorType and error when it is "error";
  // UNAVAILABLE when no JSON came back.
  absl::StatusOr<nlohmann::json> Api(const std::string& path_and_query);

  // An instant query: the result vector (an array of {metric, value}), or
  // the error as Api gives it.
  absl::StatusOr<nlohmann::json> Query(absl::string_view promql);

  // Waits until the instant query `promql` has a sample; its result, or
  // DEADLINE_EXCEEDED naming the last answer when none came before
  // `deadline`. An error answer is returned at once.
  absl::StatusOr<nlohmann::json> AwaitSample(absl::string_view promql,
                                             absl::Time deadline);

  // SIGTERM, and the exit code.
  absl::StatusOr<int> Stop();

 private:
  PrometheusServer(std::unique_ptr<Subprocess> process, int port,
                   std::string log_path);

  std::unique_ptr<Subprocess> process_;
  int port_;
  std::string log_path_;
};

// `text` with every character but the unreserved ones (A-Z a-z 0-9 - _ .
// ~) percent-encoded, for a URL's query.
std::string UrlEncode(absl::string_view text);

// A rule file's text with every `for:` duration set to 0s, so that a test
// sees an alert fire on the evaluation after its condition holds.
std::string WithoutForDurations(absl::string_view rules);

// A loopback TCP port that was free a moment ago.
int FreeLoopbackPort();

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_PROMETHEUS_SERVER_H_
