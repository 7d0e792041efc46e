// One worker process of the stack model: runs its shards through
// SyncBatchNorm layers for every step and records what the checker needs.
#ifndef SYNCNORM_TESTS_TESTING_STACK_WORKER_H_
#define SYNCNORM_TESTS_TESTING_STACK_WORKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "kernels/moments.h"
#include "tests/testing/stack_model.h"

namespace syncnorm::testing {

// What one data rank produced at the last step, and its layers' running
// statistics at the end.
struct RankOutput {
  int rank = 0;
  std::vector<std::vector<double>> y, dx;  // [layer]
  std::vector<RunningStats> running;       // [layer]
};

struct WorkerOptions {
  std::string job_id;
  // This process's contributor rank in the job.
  int process_rank = 0;
  // Data ranks hosted by this process as threads of one node (ThreadNode);
  // they are process_rank * local_size + [0, local_size).
  int local_size = 1;
  // Print a progress line per step.
  bool progress = false;
};

// Runs every step of the config for the process's data ranks. On success
// returns their outputs, after checking that each layer's local mirror of
// the running statistics equals the aggregator's bit for bit.
absl::StatusOr<std::vector<RankOutput>> RunWorker(Client& client,
                                                  const StackConfig& config,
                                                  const WorkerOptions& options);

// Serializes outputs to a file and back (for worker processes).
absl::Status WriteOutputs(const std::string& path,
                          const std::vector<RankOutput>& outputs);
absl::StatusOr<std::vector<RankOutput>> ReadOutputs(const std::string& path);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_STACK_WORKER_H_
