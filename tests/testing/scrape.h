// The aggregator's Prometheus endpoint, read the way a scraper does.
#ifndef SYNCNORM_TESTS_TESTING_SCRAPE_H_
#define SYNCNORM_TESTS_TESTING_SCRAPE_H_

#include <optional>
#include <string>

#include "absl/time/time.h"

namespace syncnorm::testing {

// "metrics_port=N" from the start line in the aggregator's log at
// `log_path`, once it is there; 0 if it is not within `timeout`.
int MetricsPortFromLog(const std::string& log_path,
                       absl::Duration timeout = absl::Seconds(10));

// The body of GET `path` from 127.0.0.1:`port` over HTTP/1.0; "" if
// unreachable.
std::string HttpGet(int port, const std::string& path);

// The body of GET /metrics from 127.0.0.1:`port`; "" if unreachable.
std::string ScrapeMetrics(int port);

// The sum of grpc_server_handled_total over the series of `text` (the
// exposition format) for syncnorm.v1.Aggregator's `method` with grpc_code
// `code` (Go's spelling: "OK", "Canceled", ...); every code when `code` is
// empty. 0 when there is none.
double HandledCalls(const std::string& text, const std::string& method,
                    const std::string& code = "");

// The value of the sample `series` (a name and its labels as the server
// writes them, e.g. `syncnorm_heap_bytes{state="allocated"}`) in `text`;
// nullopt when there is none.
std::optional<double> Sample(const std::string& text,
                             const std::string& series);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_SCRAPE_H_
