#include "server/metrics/load_metrics.h"

#include <utility>

#include "server/metrics/families.h"
#include "syncnorm_version.h"

namespace syncnorm {
namespace {

prometheus::MetricFamily Gauge(std::string name, std::string help) {
  return NewFamily(std::move(name), std::move(help),
                   prometheus::MetricType::Gauge);
}

std::vector<prometheus::MetricFamily> Constant(const Limits& limits) {
  prometheus::MetricFamily limit = Gauge(
      "syncnorm_limit",
      "The server's limits by flag name (0: no limit); see syncnorm_jobs, "
      "syncnorm_rounds_in_flight, syncnorm_open_streams, "
      "syncnorm_waiting_calls.");
  auto flag = [&limit](const char* name, int64_t value) {
    AddSample(limit, value > 0 ? static_cast<double>(value) : 0,
              {{"flag", name}});
  };
  flag("max_jobs", limits.max_jobs);
  flag("max_pending_rounds", limits.max_pending_rounds);
  flag("max_streams", limits.max_streams);
  flag("max_waiting_calls", limits.max_waiting_calls);
  flag("max_message_bytes", limits.max_message_bytes);
  prometheus::MetricFamily build =
      Gauge("syncnorm_build_info", "1, labelled with the server's version.");
  AddSample(build, 1, {{"version", kSyncnormVersion}});
  return {std::move(limit), std::move(build)};
}

}  // namespace

LoadMetrics::LoadMetrics(const Limits& limits) : constant_(Constant(limits)) {}

void LoadMetrics::SetSource(Source source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

std::vector<prometheus::MetricFamily> LoadMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out = constant_;
  absl::MutexLock lock(&mu_);  // the source stays valid while it is read
  if (!source_) return out;
  const ServerLoad load = source_();
  const std::pair<const char*, const char*> kNames[] = {
      {"syncnorm_jobs", "Jobs on the server (at most --max_jobs)."},
      {"syncnorm_rounds_in_flight",
       "Rounds waiting for ranks (at most --max_pending_rounds)."},
      {"syncnorm_open_streams", "Open Reduce streams (at most --max_streams)."},
      {"syncnorm_waiting_calls",
       "ReduceOnce and Checkpoint calls the server holds (at most "
       "--max_waiting_calls)."},
      {"syncnorm_grpc_calls",
       "Calls gRPC holds for the service, from their arrival to their "
       "release: streams, waiting calls and calls not yet answered."}};
  const int64_t values[] = {load.jobs, load.rounds_in_flight, load.open_streams,
                            load.waiting_calls, load.grpc_calls};
  for (size_t i = 0; i < 5; ++i) {
    out.push_back(Gauge(kNames[i].first, kNames[i].second));
    AddSample(out.back(), static_cast<double>(values[i]));
  }
  prometheus::MetricFamily closed = NewFamily(
      "syncnorm_connections_closed_total",
      "Client connections the server closed for abuse: overload (calls "
      "started while the server held too many), rapid_reset (calls "
      "cancelled as they were sent), unauthenticated (calls without a "
      "valid token), read_flood (requests arriving faster than the server "
      "could take them, its memory growing).",
      prometheus::MetricType::Counter);
  for (int r = 0; r < kCloseReasons; ++r) {
    AddSample(closed, static_cast<double>(load.connections_closed[r]),
              {{"reason", CloseReasonName(static_cast<CloseReason>(r))}});
  }
  out.push_back(std::move(closed));
  if (load.durable) {
    const std::pair<const char*, const char*> kLog[] = {
        {"syncnorm_round_log_bytes_total",
         "Bytes of completed rounds' records (kept for retries) written to "
         "the round log since the server started."},
        {"syncnorm_round_log_spilled_bytes_total",
         "Of syncnorm_round_log_bytes_total, the bytes written on to "
         "RocksDB because the round log needed the room before the records "
         "expired. More than a few percent: raise --round_log_mib "
         "(docs/operations.md, Sizing it)."}};
    const int64_t log_values[] = {load.round_log_bytes,
                                  load.round_log_spilled_bytes};
    for (size_t i = 0; i < 2; ++i) {
      out.push_back(NewFamily(kLog[i].first, kLog[i].second,
                              prometheus::MetricType::Counter));
      AddSample(out.back(), static_cast<double>(log_values[i]));
    }
  }
  return out;
}

}  // namespace syncnorm
