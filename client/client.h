// The syncnorm client: admin calls and the factory of contributors.
#ifndef SYNCNORM_CLIENT_CLIENT_H_
#define SYNCNORM_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client_options.h"
#include "client/contributor.h"
#include "client/layer_spec.h"
#include "client/node_group.h"
#include "client/solo_node_group.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

// The content of a PEM file (a certificate or key for ClientOptions);
// NOT_FOUND naming the path when it cannot be read.
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

// A connection to the aggregator: one server, or several shards
// (ClientOptions::address lists them) over which each job's layers are
// spread by rendezvous hashing of (job_id, layer) (client/shard_router.h).
// Every call carries a deadline (ClientOptions::rpc_timeout) and waits for
// the server to become reachable within it, so a restarting server is
// ridden out (as is a connection that breaks under a call: every call
// below is idempotent); a server still unreachable then is UNAVAILABLE
// naming it. An error the server answered is returned at once.
//
// With several shards, CreateJob, DeleteJob, Checkpoint,
// RestoreCheckpoint and UpdateMembership go to every shard (in parallel) and
// succeed only when every shard does; an error names the shard ("shard 1
// (host:port): ..."). They are not atomic across shards: after a failure some
// shards may have done the call; repeating it is safe (each is idempotent).
// GetJob and ListJobs merge the shards' answers (committed_step: the minimum
// over the shards holding layers; next_step: the maximum; membership: the
// newest version); a job that some of its shards no longer hold (a lost volume)
// is reported with JobInfo.missing_shards and committed_step -1.
// GetRunningStats and SetRunningStats ask the shards that hold the layers and
// answer in the caller's layer order. The shard list must stay the same for the
// life of a job. Thread-safe.
class Client {
 public:
  explicit Client(const ClientOptions& options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  // The shards parsed from options().address, in ordinal order (one entry
  // for a single aggregator, also when the address does not parse: then
  // every call fails with INVALID_ARGUMENT saying why).
  std::vector<std::string> shards() const;
  // The ordinal of the shard that holds `layer` of `job_id`.
  int ShardOf(const std::string& job_id, int layer) const;

  // Creates the job, or returns it if it exists with the same spec.
  // ALREADY_EXISTS when it exists with a different spec. With several
  // shards, FAILED_PRECONDITION when the job has applied steps on some of
  // them and is gone from others (they lost their state: RestoreBackup
  // first); a job on some shards only, with nothing applied (a CreateJob
  // that failed half way), is completed.
  absl::StatusOr<v1::JobInfo> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& job_id);
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<v1::RunningStats> GetRunningStats(
      const v1::GetRunningStatsRequest& request);
  // Every job on the server, by job_id.
  absl::StatusOr<std::vector<v1::JobInfo>> ListJobs();
  // The job's statistics health, merged over the shards (each scores the
  // layers it holds): the flags of every shard, in force first, at most
  // 256; counts summed; refusals summed per rank. A shard that no longer
  // holds the job is named in missing_shards.
  absl::StatusOr<v1::StatsHealth> GetStatsHealth(const std::string& job_id);

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
  // Changes which ranks contribute from request.step() on (an elastic
  // job; see UpdateMembership in aggregator.proto): ranks join, leave, or
  // are removed when gone. Returns the job with its new membership.
  // Idempotent. FAILED_PRECONDITION for a step some layer has completed
  // (the message names the job's next_step) or before the latest change's;
  // INVALID_ARGUMENT for a rank out of range, named twice, or no member
  // left. With several shards, step 0 (the next step) is resolved here: the
  // highest next_step of the shards, sent to every shard; when their steps
  // move past it meanwhile, it is asked for and sent again, a few times.
  // ABORTED when that left the change in force from different steps on
  // different shards (some took an earlier try): then name the step.
  absl::StatusOr<v1::JobInfo> UpdateMembership(
      const v1::UpdateMembershipRequest& request);
  // Replaces the running statistics of some layers (an import).
  absl::StatusOr<v1::RunningStats> SetRunningStats(
      const v1::SetRunningStatsRequest& request);

  // Backups, in each server's --backup_dir (an admin token). Every shard
  // writes and reads its own copy, <name>/shard-<ordinal>; each call goes
  // to every shard and fails if one does, naming it. `timeout` bounds each
  // shard's call (default rpc_timeout).
  //
  // Writes the backup `name` (empty: the UTC time now, e.g.
  // 20240601-120000, the same on every shard) of every job, or of
  // `job_id`; one answer per shard, in ordinal order.
  absl::StatusOr<std::vector<v1::BackupInfo>> Backup(
      const std::string& name, const std::string& job_id = "",
      std::optional<absl::Duration> timeout = std::nullopt);
  // The backups, oldest first, one per name: with several shards merged
  // (jobs merged as by GetJob, bytes summed, missing_shards: the shards
  // without that backup).
  absl::StatusOr<std::vector<v1::BackupInfo>> ListBackups();
  // Loads backup `name`'s jobs (or `job_id` only) into every shard from its
  // own copy; a job a shard still holds is kept unless `replace`. One
  // answer per shard, in ordinal order.
  absl::StatusOr<std::vector<v1::RestoreBackupResponse>> RestoreBackup(
      const std::string& name, const std::string& job_id = "",
      bool replace = false,
      std::optional<absl::Duration> timeout = std::nullopt);

  // A contributor for `rank` of the job, with its own Reduce stream on this
  // client's channel, or on the relay's (ClientOptions::relay), which takes
  // every layer; with relay_fallback, rounds the relay cannot take go to
  // each layer's shard (RelayFallback). With several shards and no relay it
  // reaches shard 0 only (rounds of layers held elsewhere fail
  // FAILED_PRECONDITION): use NewNodeGroup.
  std::unique_ptr<Contributor> NewContributor(const std::string& job_id,
                                              int rank) const;

  // The node group of a node with one worker, `rank` of the job: its rounds
  // go to the shard of each layer (a SoloNodeGroup with one shard), or all
  // to the relay when there is one. Also
  // the upstream of a ThreadNode or an NCCL node's leader.
  std::unique_ptr<NodeGroup> NewNodeGroup(const std::string& job_id,
                                          int rank) const;

 private:
  struct Shard {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Aggregator::Stub> stub;
  };

  // The channel to options_.relay; null without a relay.
  std::shared_ptr<grpc::Channel> relay_channel_;

  // One call to shard `shard`. Errors name the shard when there are
  // several; a server unreachable for the whole call is UNAVAILABLE.
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<Response> UnaryOn(size_t shard, const Request& request,
                                   Call call, absl::Duration timeout) const;
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<Response> UnaryOn(size_t shard, const Request& request,
                                   Call call) const {
    return UnaryOn<Request, Response>(shard, request, call,
                                      options_.rpc_timeout);
  }
  // call(i) for every shard i, in parallel; the answers by shard.
  template <typename Response>
  std::vector<absl::StatusOr<Response>> OnEveryShard(
      const std::function<absl::StatusOr<Response>(size_t)>& call) const;
  // The CreateJob request for shard `shard`: the job's spec and, with
  // several shards, the layers it holds.
  v1::CreateJobRequest ForShard(const v1::CreateJobRequest& request,
                                size_t shard) const;
  absl::StatusOr<v1::RunningStats> GetRunningStatsSharded(
      const v1::GetRunningStatsRequest& request);
  // FAILED_PRECONDITION when the job applied steps on some shards and is
  // gone from others (a lost volume), which CreateJob must not paper over;
  // OK otherwise, errors of the shards included (CreateJob reports them).
  absl::Status CheckNotLost(const std::string& job_id);

  // Constant after construction.
  const ClientOptions options_;
  // Why options_.address does not parse; OK when it does.
  absl::Status address_status_;
  std::vector<Shard> shards_;  // at least one
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_H_
