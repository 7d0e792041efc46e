// The PromQL a Grafana dashboard (a dashboard's JSON model) sends to
// Prometheus, for tests that run it against a real Prometheus.
#ifndef SYNCNORM_TESTS_TESTING_DASHBOARD_QUERIES_H_
#define SYNCNORM_TESTS_TESTING_DASHBOARD_QUERIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace syncnorm::testing {

struct DashboardQuery {
  std::string where;  // "panel 'Title' A", or "variable 'pod'"
  std::string expr;   // with the variables replaced
};

// Every panel target's expr (rows' nested panels included), and the series
// selector of every query variable of the form label_values(SELECTOR,
// LABEL), with the variables replaced as Grafana does before it sends
// them: a template variable by its "All" value (allValue) where it
// includes All, else by its current value; $__rate_interval by 30s,
// $__interval by 5s and $__range by 5m. INVALID_ARGUMENT when the JSON
// does not parse or a target has no expr.
absl::StatusOr<std::vector<DashboardQuery>> DashboardQueries(
    absl::string_view dashboard_json);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_DASHBOARD_QUERIES_H_
