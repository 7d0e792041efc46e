// The statistics-health metrics the monitoring (deploy/monitoring) reads,
// by their contract: syncnorm_stats_health_flags{kind} (a gauge: flags in
// force on the server, kind one of mean_shift, variance_ratio,
// stuck_channel, dead_channel), syncnorm_stats_health_flags_raised_total
// {kind} and syncnorm_nonfinite_contributions_total (counters).
// tests:monitoring_stats_health_test holds the server to it;
// tests:monitoring_test leaves the expressions that read them to that test.
#ifndef SYNCNORM_TESTS_TESTING_STATS_HEALTH_METRICS_H_
#define SYNCNORM_TESTS_TESTING_STATS_HEALTH_METRICS_H_

#include <set>
#include <string>

namespace syncnorm::testing {

inline const std::set<std::string>& StatsHealthMetrics() {
  static const auto* names = new std::set<std::string>{
      "syncnorm_stats_health_flags", "syncnorm_stats_health_flags_raised_total",
      "syncnorm_nonfinite_contributions_total"};
  return *names;
}

// Whether `names` (an expression's, see MetricNames) holds one of them.
inline bool ReadsStatsHealth(const std::set<std::string>& names) {
  for (const std::string& n : names) {
    if (StatsHealthMetrics().count(n) > 0) return true;
  }
  return false;
}

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_STATS_HEALTH_METRICS_H_
