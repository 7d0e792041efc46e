#include "relay/relay_service.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace syncnorm {
namespace {

// A stream's contributions waiting for their answers, past which it reads
// no more until some are answered: what one stream can make the relay hold.
constexpr int kMaxPendingPerStream = 1024;

std::string Authorization(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// Whether the relay takes `c` from this caller. A child relay's block
// needs the `relay` scope besides the job's, as the shard asks (a rank's
// job token cannot vouch for other ranks); a round age from a caller
// without it is dropped, as the shard drops it (a rank's would close the
// round early for everyone).
absl::Status Admit(const Authenticator* auth, const std::string& authorization,
                   v1::Contribution& c) {
  if (c.round_age_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round_age_ms ", c.round_age_ms(),
        " is negative; a relay sets how long the round had been open at it, "
        "at least 0, and a rank leaves it unset"));
  }
  if (auth == nullptr) return absl::OkStatus();
  if (c.has_relay()) return auth->AuthorizeRelay(authorization, c.job_id());
  absl::Status job = auth->AuthorizeJob(authorization, c.job_id());
  if (job.ok() && c.round_age_ms() > 0 &&
      !auth->AuthorizeRelay(authorization, c.job_id()).ok()) {
    c.clear_round_age_ms();
  }
  return job;
}

// One rank's Reduce stream: each contribution goes to the relay, each
// answer is written when it comes, one write at a time. Owns itself until
// gRPC is done with the call and every answer has come back.
class ReduceStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static void Start(grpc::CallbackServerContext* context, Relay& relay,
                    const Authenticator* auth, ReduceStream** out) {
    auto stream = std::shared_ptr<ReduceStream>(
        new ReduceStream(Authorization(context), relay, auth));
    stream->self_ = stream;
    *out = stream.get();
    stream->StartRead(&stream->request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinish();
      }
      if (finish) Finish(FinalStatus());
      return;
    }
    v1::Contribution c;
    // Takes the buffer's bytes, leaving it empty for the next read.
    if (!grpc::SerializationTraits<v1::Contribution>::Deserialize(&request_, &c)
             .ok()) {
      // As the typed API: the call fails, and its answers go nowhere.
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        unparsable_ = true;
        reads_done_ = true;
        Break();
        finish = ShouldFinish();
      }
      if (finish) Finish(FinalStatus());
      return;
    }
    bool hold;
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
      hold = pending_ >= kMaxPendingPerStream;
      read_held_ = hold;
    }
    absl::Status refused = Admit(auth_, authorization_, c);
    // The answer keeps the stream alive: it may come after OnDone.
    std::shared_ptr<ReduceStream> me = self_;
    if (!refused.ok()) {
      Enqueue(ErrorAnswer(c, refused));
    } else {
      relay_.Contribute(std::move(c), [me](const RoundAnswer& answer) {
        me->Enqueue(answer);
      });
    }
    if (!hold) StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    RoundAnswer next;
    bool release;
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      --pending_;
      if (!ok) Break();
      if (!queue_.empty()) {
        next = queue_.front();
      } else {
        writing_ = false;
      }
      release = read_held_ && !broken_ && pending_ < kMaxPendingPerStream;
      if (release) read_held_ = false;
      finish = ShouldFinish();
    }
    if (next != nullptr) StartWrite(&next->bytes);
    if (release) StartRead(&request_);
    if (finish) Finish(FinalStatus());
  }

  void OnCancel() override {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      Break();
      finish = ShouldFinish();
    }
    if (finish) Finish(FinalStatus());
  }

  void OnDone() override { self_.reset(); }

 private:
  ReduceStream(std::string authorization, Relay& relay,
               const Authenticator* auth)
      : authorization_(std::move(authorization)), relay_(relay), auth_(auth) {}

  // Writes `answer` after those before it; dropped once the stream broke.
  void Enqueue(const RoundAnswer& answer) ABSL_LOCKS_EXCLUDED(mu_) {
    bool write = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (broken_ || finished_) {
        --pending_;
        finish = ShouldFinish();
      } else {
        queue_.push_back(answer);
        write = !writing_;
        writing_ = true;
      }
    }
    // Outside the lock: gRPC may run a reaction on this thread.
    if (write) StartWrite(&answer->bytes);
    if (finish) Finish(FinalStatus());
  }

  // The call is gone: no more writes, no more reads.
  void Break() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    broken_ = true;
    if (read_held_) {
      read_held_ = false;
      reads_done_ = true;
    }
    // A write in flight keeps its answer until OnWriteDone.
    const size_t keep = writing_ ? 1 : 0;
    while (queue_.size() > keep) {
      queue_.pop_back();
      --pending_;
    }
  }

  // Whether to Finish now (then marks it finished).
  bool ShouldFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || writing_ || (pending_ > 0 && !broken_)) {
      return false;
    }
    finished_ = true;
    return true;
  }

  grpc::Status FinalStatus() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (unparsable_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Reduce stream message is not a Contribution");
    }
    return broken_ ? grpc::Status::CANCELLED : grpc::Status::OK;
  }

  // Constant after construction.
  const std::string authorization_;
  Relay& relay_;
  const Authenticator* const auth_;

  grpc::ByteBuffer request_;            // the read in flight's
  std::shared_ptr<ReduceStream> self_;  // until OnDone

  absl::Mutex mu_;
  std::deque<RoundAnswer> queue_ ABSL_GUARDED_BY(mu_);  // front: writing
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // contributions not yet answered
  bool read_held_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool unparsable_ ABSL_GUARDED_BY(mu_) = false;
};

// One ReduceOnce: the relay's answer, a failed round as the call's status.
class UnaryRound final : public grpc::ServerUnaryReactor {
 public:
  static UnaryRound* Start(grpc::CallbackServerContext* context,
                           const v1::Contribution& request,
                           v1::RoundResult* response, Relay& relay,
                           const Authenticator* auth) {
    auto round = std::shared_ptr<UnaryRound>(new UnaryRound(response));
    round->self_ = round;
    UnaryRound* raw = round.get();
    v1::Contribution c = request;
    absl::Status refused = Admit(auth, Authorization(context), c);
    if (!refused.ok()) {
      raw->Answer(ErrorAnswer(c, refused));
    } else {
      relay.Contribute(std::move(c), [round](const RoundAnswer& answer) {
        round->Answer(answer);
      });
    }
    return raw;
  }

  void OnCancel() override {
    if (Claim()) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { self_.reset(); }

 private:
  explicit UnaryRound(v1::RoundResult* response) : response_(response) {}

  void Answer(const RoundAnswer& answer) {
    if (!Claim()) return;
    if (!answer->result.has_error()) *response_ = answer->result;
    Finish(UnaryStatus(answer->result));
  }

  // True for the first caller only: Finish is called once.
  bool Claim() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

  v1::RoundResult* const response_;
  std::shared_ptr<UnaryRound> self_;  // until OnDone
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context,
                                 const char* method) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(
      grpc::StatusCode::UNIMPLEMENTED,
      absl::StrCat("a relay serves rounds only (Reduce, ReduceOnce); send ",
                   method, " to the aggregator shards")));
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
RelayService::Reduce(grpc::CallbackServerContext* context) {
  ReduceStream* stream = nullptr;
  ReduceStream::Start(context, relay_, auth_, &stream);
  return stream;
}

grpc::ServerUnaryReactor* RelayService::ReduceOnce(
    grpc::CallbackServerContext* context, const v1::Contribution* request,
    v1::RoundResult* response) {
  return UnaryRound::Start(context, *request, response, relay_, auth_);
}

#define SYNCNORM_RELAY_REFUSE(Method, Request, Response)                 \
  grpc::ServerUnaryReactor* RelayService::Method(                        \
      grpc::CallbackServerContext* context, const Request*, Response*) { \
    return Refuse(context, #Method);                                     \
  }

SYNCNORM_RELAY_REFUSE(CreateJob, v1::CreateJobRequest, v1::JobInfo)
SYNCNORM_RELAY_REFUSE(GetJob, v1::GetJobRequest, v1::JobInfo)
SYNCNORM_RELAY_REFUSE(DeleteJob, v1::DeleteJobRequest, v1::DeleteJobResponse)
SYNCNORM_RELAY_REFUSE(GetRunningStats, v1::GetRunningStatsRequest,
                      v1::RunningStats)
SYNCNORM_RELAY_REFUSE(Checkpoint, v1::CheckpointRequest, v1::CheckpointInfo)
SYNCNORM_RELAY_REFUSE(ListCheckpoints, v1::ListCheckpointsRequest,
                      v1::ListCheckpointsResponse)
SYNCNORM_RELAY_REFUSE(RestoreCheckpoint, v1::RestoreCheckpointRequest,
                      v1::JobInfo)
SYNCNORM_RELAY_REFUSE(ListJobs, v1::ListJobsRequest, v1::ListJobsResponse)
SYNCNORM_RELAY_REFUSE(SetRunningStats, v1::SetRunningStatsRequest,
                      v1::RunningStats)
SYNCNORM_RELAY_REFUSE(Backup, v1::BackupRequest, v1::BackupInfo)
SYNCNORM_RELAY_REFUSE(ListBackups, v1::ListBackupsRequest,
                      v1::ListBackupsResponse)
SYNCNORM_RELAY_REFUSE(RestoreBackup, v1::RestoreBackupRequest,
                      v1::RestoreBackupResponse)
SYNCNORM_RELAY_REFUSE(UpdateMembership, v1::UpdateMembershipRequest,
                      v1::JobInfo)
SYNCNORM_RELAY_REFUSE(GetStatsHealth, v1::GetStatsHealthRequest,
                      v1::StatsHealth)

#undef SYNCNORM_RELAY_REFUSE

}  // namespace syncnorm
