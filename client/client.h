// The syncnorm client: admin calls and the factory of contributors.
#ifndef SYNCNORM_CLIENT_CLIENT_H_
#define SYNCNORM_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client_options.h"
#include "client/contributor.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

// A connection to one aggregator. Every call carries a deadline
// (ClientOptions::rpc_timeout) and waits for the server to become reachable
// within it, so a restarting server is ridden out. Thread-safe.
class Client {
 public:
  explicit Client(const ClientOptions& options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  // Creates the job, or returns it if it exists with the same spec.
  // ALREADY_EXISTS when it exists with a different spec.
  absl::StatusOr<v1::JobInfo> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& job_id);
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<v1::RunningStats> GetRunningStats(
      const v1::GetRunningStatsRequest& request);
  // Every job on the server, by job_id.
  absl::StatusOr<std::vector<v1::JobInfo>> ListJobs();

  // Waits (at most `timeout`, default rpc_timeout) until `step` is
  // committed by every layer of every group, then stores an immutable
  // checkpoint. DEADLINE_EXCEEDED names the lagging layers; ALREADY_EXISTS
  // when the step has a checkpoint with another tag. Idempotent otherwise.
  absl::StatusOr<v1::CheckpointInfo> Checkpoint(
      const std::string& job_id, int64_t step, const std::string& tag = "",
      std::optional<absl::Duration> timeout = std::nullopt);
  // The job's checkpoints, oldest first.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(
      const std::string& job_id);
  // Rolls the job back to its checkpoint at `step`; training resumes with
  // step + 1 (see LoadRunningStats in running_stats.h for the layers).
  absl::StatusOr<v1::JobInfo> RestoreCheckpoint(const std::string& job_id,
                                                int64_t step);
  // Replaces the running statistics of some layers (an import).
  absl::StatusOr<v1::RunningStats> SetRunningStats(
      const v1::SetRunningStatsRequest& request);

  // A contributor for `rank` of the job, with its own Reduce stream on this
  // client's channel.
  std::unique_ptr<Contributor> NewContributor(const std::string& job_id,
                                              int rank) const;

 private:
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<Response> Unary(const Request& request, Call call,
                                 absl::Duration timeout);
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<Response> Unary(const Request& request, Call call) {
    return Unary<Request, Response>(request, call, options_.rpc_timeout);
  }

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Aggregator::Stub> stub_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_H_
