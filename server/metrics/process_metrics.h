// The process's own gauges, as Prometheus's client libraries export them
// (process_*), and the heap's split between what is allocated and what
// malloc holds free.
#ifndef SYNCNORM_SERVER_METRICS_PROCESS_METRICS_H_
#define SYNCNORM_SERVER_METRICS_PROCESS_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"

namespace syncnorm {

// Read from /proc/self and glibc at each call (a scrape):
//   process_resident_memory_bytes, process_virtual_memory_bytes
//   process_cpu_seconds_total         user and system time, a counter
//   process_open_fds, process_max_fds
//   process_start_time_seconds        since the Unix epoch
//   syncnorm_heap_bytes{state}        "allocated": what the server's
//     objects hold; "free": what malloc keeps for reuse, resident or not
//     (the server gives the free pages back to the kernel every 5 s).
//     With glibc's malloc only: absent when another allocator serves
//     malloc (a sanitizer's, a preloaded tcmalloc).
// A fact that cannot be read is left out. Thread-safe.
std::vector<prometheus::MetricFamily> CollectProcessMetrics();

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_PROCESS_METRICS_H_
