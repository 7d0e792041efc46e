// Round-worker processes (tests/round_worker_main.cc) of many jobs against
// one aggregator, and the checks of what they logged: the harness of the
// fault and soak tests.
#ifndef SYNCNORM_TESTS_TESTING_ROUND_CLUSTER_H_
#define SYNCNORM_TESTS_TESTING_ROUND_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/round_payload.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {

struct RoundClusterOptions {
  std::string address;  // where the workers connect (the proxy, say)
  std::string dir;      // logs and the stop file
  std::vector<std::string> jobs;
  int world_size = 4;  // one worker process per rank
  int layers = 8;
  int channels = 4;
  int64_t round_timeout_ms = 2000;  // the jobs' (server side)
};

// One worker process per rank, each contributing that rank of every job.
class RoundCluster {
 public:
  explicit RoundCluster(RoundClusterOptions options);
  ~RoundCluster();

  // Creates the jobs (world_size ranks, `layers` layers of `channels`,
  // the round timeout) through `server`.
  absl::Status CreateJobs(const std::string& server) const;
  // Starts (or restarts) the worker of `rank`.
  absl::Status StartWorker(int rank);
  absl::Status StartAll();
  // kill -9 of the worker of `rank`.
  void KillWorker(int rank);
  // Tells every worker to stop after its current step and waits (bounded);
  // an error names a worker that hung or failed.
  absl::Status StopAll(absl::Duration timeout);

  std::string LogPath(int rank) const;
  std::vector<std::string> LogPaths() const;
  // Completed rounds logged so far by `rank`'s workers.
  int CompletedRounds(int rank) const;

  // Checks the logs and the server: no wrong result (B), no call that
  // overran its bound (H), versions of every (job, layer) 1..N without
  // gaps or repeats, and the server's running statistics equal to the
  // long-double replay of the completed rounds (and N batches tracked).
  // `min_rounds_per_job`: each job completed at least that many rounds.
  absl::Status Check(const std::string& server, int min_rounds_per_job) const;

 private:
  const RoundClusterOptions options_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
};

// /proc facts of a process: resident memory, open fds, threads.
struct ProcStats {
  int64_t rss_kb = 0;
  int fds = 0;
  int threads = 0;
};
absl::StatusOr<ProcStats> ReadProcStats(pid_t pid);

// The resident memory of `pid` in kB once it is at most `kb` (looked at
// every 100 ms), or at `timeout`; -1 once the process cannot be read.
int64_t RssKbOnceAtMost(pid_t pid, int64_t kb, absl::Duration timeout);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_ROUND_CLUSTER_H_
