// The gauges of what the server's limits bound, and its build.
#ifndef SYNCNORM_SERVER_METRICS_LOAD_METRICS_H_
#define SYNCNORM_SERVER_METRICS_LOAD_METRICS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"
#include "server/domain/limits.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// What the server holds now, against its limits.
struct ServerLoad {
  int64_t jobs = 0;              // --max_jobs
  int64_t rounds_in_flight = 0;  // --max_pending_rounds
  int64_t open_streams = 0;      // --max_streams
  int64_t waiting_calls = 0;     // --max_waiting_calls
  // Calls gRPC holds for the service (ConnectionGuard::calls_held()).
  int64_t grpc_calls = 0;
  // Connections the ConnectionGuard closed, by CloseReason.
  int64_t connections_closed[kCloseReasons] = {};
  // With a data dir: the round log's round records, in bytes, and those
  // of them written on to RocksDB for room
  // (RingLogEngine::transient_bytes).
  bool durable = false;
  int64_t round_log_bytes = 0;
  int64_t round_log_spilled_bytes = 0;
};

// Gauges read when scraped, so they are never stale:
//   syncnorm_jobs, syncnorm_rounds_in_flight, syncnorm_open_streams,
//   syncnorm_waiting_calls, syncnorm_grpc_calls   the ServerLoad fields
//   syncnorm_connections_closed_total{reason}  a counter
//                               (absent until a source is set)
//   syncnorm_round_log_bytes_total, syncnorm_round_log_spilled_bytes_total
//                               counters, with a data dir only
//   syncnorm_limit{flag}        each limit's value (0: none), e.g.
//                               syncnorm_limit{flag="max_streams"}, so that
//                               alerts can divide one by the other
//   syncnorm_build_info{version}  1, with the project's version
// Thread-safe.
class LoadMetrics {
 public:
  using Source = std::function<ServerLoad()>;

  explicit LoadMetrics(const Limits& limits);

  // Where the load gauges come from from now on; an empty `source` takes
  // them away. Returns once no Collect() is using the previous source, so
  // what it reads may be destroyed after SetSource({}).
  void SetSource(Source source) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<prometheus::MetricFamily> Collect() const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::vector<prometheus::MetricFamily> constant_;  // limits, build

  mutable absl::Mutex mu_;
  Source source_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_LOAD_METRICS_H_
