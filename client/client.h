// The syncnorm client: admin calls and the factory of contributors.
#ifndef SYNCNORM_CLIENT_CLIENT_H_
#define SYNCNORM_CLIENT_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

  // A contributor for `rank` of the job, with its own Reduce stream on this
  // client's channel.
  std::unique_ptr<Contributor> NewContributor(const std::string& job_id,
                                              int rank) const;

 private:
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<Response> Unary(const Request& request, Call call);

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Aggregator::Stub> stub_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_H_
