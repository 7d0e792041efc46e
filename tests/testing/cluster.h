// A real aggregator process and real worker processes on loopback.
#ifndef SYNCNORM_TESTS_TESTING_CLUSTER_H_
#define SYNCNORM_TESTS_TESTING_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "tests/testing/stack_model.h"
#include "tests/testing/stack_worker.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {

// The aggregator binary started on a free loopback port.
class AggregatorProcess {
 public:
  // Starts it with --listen=127.0.0.1:0 and the extra flags; returns once
  // the port is known. Its log goes to <dir>/aggregator.log.
  static absl::StatusOr<std::unique_ptr<AggregatorProcess>> Start(
      const std::string& dir, const std::vector<std::string>& flags = {});

  std::string address() const;  // 127.0.0.1:<port>
  int port() const { return port_; }
  Subprocess& process() { return *process_; }
  // SIGTERM, then the exit code.
  absl::StatusOr<int> Stop();

 private:
  std::unique_ptr<Subprocess> process_;
  int port_ = 0;
};

// The CreateJob request of a stack config: one layer spec per BN layer.
// local_size > 1 makes each contributor a node of that many data ranks.
v1::CreateJobRequest JobRequest(const StackConfig& config,
                                const std::string& job_id,
                                int64_t round_timeout_ms, int local_size = 1);

struct WorkersOptions {
  std::string address;  // the aggregator, or its shards "a:1,b:2,..."
  std::string job_id;
  std::string dir;        // scratch folder for outputs and logs
  int local_size = 1;     // data ranks per worker process
  bool progress = false;  // the first worker prints a line per step
  absl::Duration timeout = absl::Minutes(5);
};

// Runs the worker processes of a config to completion and gathers every
// data rank's outputs. A worker that fails makes this fail with its log.
absl::StatusOr<std::vector<RankOutput>> RunWorkers(const StackConfig& config,
                                                   const WorkersOptions& opts);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_CLUSTER_H_
