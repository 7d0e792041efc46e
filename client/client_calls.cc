// Client: the calls. With several shards each goes to the shards concerned
// (client.h says which) and their answers are merged here.
#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/proto_convert.h"
#include "client/shard_router.h"
#include "grpcpp/client_context.h"

namespace syncnorm {
namespace {

// How often UpdateMembership with step 0 over several shards asks for the
// next step and sends it, while the shards' steps move on under it.
constexpr int kMembershipAttempts = 5;

// The first error of a fan-out, or OK.
template <typename T>
absl::Status FirstError(const std::vector<absl::StatusOr<T>>& results) {
  for (const absl::StatusOr<T>& r : results) {
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

// Whether a shard's JobInfo speaks for a committed step: it holds layers.
bool HoldsLayers(const v1::JobInfo& info) {
  return !info.has_shard() || info.shard().owned_layers_size() > 0;
}

// One job's answers from several shards as one: by_shard[i] is shard i's
// answer, null when it does not hold the job. The spec, and the lowest
// committed step of the shards that hold layers (-1 if none does); a shard
// of the job (one below its num_shards) that does not hold it is named in
// missing_shards, and then no step is committed.
// REQUIRES: some by_shard[i] is not null.
v1::JobInfo MergeJobInfos(const std::vector<const v1::JobInfo*>& by_shard) {
  const v1::JobInfo* first = nullptr;
  for (const v1::JobInfo* info : by_shard) {
    if (first == nullptr) first = info;
  }
  v1::JobInfo out = *first;
  out.clear_shard();
  out.clear_missing_shards();
  const int expected =
      first->has_shard() && first->shard().num_shards() > 0
          ? std::min<int>(first->shard().num_shards(), by_shard.size())
          : static_cast<int>(by_shard.size());
  for (int i = 0; i < expected; ++i) {
    if (by_shard[i] == nullptr) out.add_missing_shards(i);
  }
  int64_t committed = INT64_MAX;
  for (const v1::JobInfo* info : by_shard) {
    if (info != nullptr && HoldsLayers(*info)) {
      committed = std::min(committed, info->committed_step());
    }
  }
  out.set_committed_step(
      committed == INT64_MAX || out.missing_shards_size() > 0 ? -1 : committed);
  // Every shard holds the whole membership and gets every change; one that
  // missed the latest (a change that failed half way) shows an older
  // version: the newest is the job's. The first step a change may name is
  // the highest: a layer of any shard may have completed it.
  for (const v1::JobInfo* info : by_shard) {
    if (info == nullptr) continue;
    if (info->membership().version() > out.membership().version()) {
      *out.mutable_membership() = info->membership();
    }
    out.set_next_step(std::max(out.next_step(), info->next_step()));
  }
  return out;
}

absl::StatusOr<v1::JobInfo> MergeJobInfos(
    const std::vector<absl::StatusOr<v1::JobInfo>>& results) {
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  if (results.size() == 1) return *results[0];
  std::vector<const v1::JobInfo*> infos;
  for (const auto& r : results) infos.push_back(&*r);
  return MergeJobInfos(infos);
}

// The first error of a fan-out of a job's call. A job that only some
// shards lack lost their state: their NOT_FOUND says so.
template <typename T>
absl::Status FirstJobError(const std::vector<absl::StatusOr<T>>& results) {
  bool some_hold = false;
  for (const absl::StatusOr<T>& r : results) some_hold = some_hold || r.ok();
  for (const absl::StatusOr<T>& r : results) {
    if (r.ok()) continue;
    if (some_hold && r.status().code() == absl::StatusCode::kNotFound &&
        absl::StrContains(r.status().message(), "not found")) {
      // The server's advice (create the job) does not fit a lost shard.
      absl::string_view message = r.status().message();
      message = message.substr(0, message.find("; create it with"));
      return absl::NotFoundError(
          absl::StrCat(message,
                       ", while the other shards hold it: this shard lost "
                       "its state; restore it from a backup (RestoreBackup, "
                       "syncnormctl restore-backup)"));
    }
    return r.status();
  }
  return absl::OkStatus();
}

// The same backup's answers from several shards as one: by_shard[i] is
// shard i's, null when it has none.
v1::BackupInfo MergeBackups(
    const std::vector<const v1::BackupInfo*>& by_shard) {
  const v1::BackupInfo* first = nullptr;
  for (const v1::BackupInfo* b : by_shard) {
    if (first == nullptr) first = b;
  }
  v1::BackupInfo out = *first;
  out.clear_jobs();
  out.clear_path();
  out.set_bytes(0);
  std::map<std::string, std::vector<const v1::JobInfo*>> jobs;
  for (size_t i = 0; i < by_shard.size(); ++i) {
    const v1::BackupInfo* b = by_shard[i];
    if (b == nullptr) {
      out.add_missing_shards(static_cast<int>(i));
      continue;
    }
    out.set_created_unix_ms(
        std::max(out.created_unix_ms(), b->created_unix_ms()));
    out.set_bytes(out.bytes() + b->bytes());
    for (const v1::JobInfo& job : b->jobs()) {
      auto& slot = jobs[job.job_id()];
      slot.resize(by_shard.size(), nullptr);
      slot[i] = &job;
    }
  }
  for (const auto& [id, infos] : jobs) *out.add_jobs() = MergeJobInfos(infos);
  return out;
}

// The shards' answers to one UpdateMembership as one, or ABORTED when
// their latest changes start at different steps: an earlier try took
// effect on some shards before others refused it (their layers had moved
// on), and a shard keeps a change already in force.
absl::StatusOr<v1::JobInfo> SameChangeEverywhere(
    const std::vector<absl::StatusOr<v1::JobInfo>>& results,
    const std::vector<std::string>& addresses) {
  std::vector<std::string> steps;
  bool same = true;
  for (size_t i = 0; i < results.size(); ++i) {
    const v1::Membership& m = results[i]->membership();
    const int64_t step =
        m.history_size() > 0 ? m.history(m.history_size() - 1).step() : 0;
    steps.push_back(
        absl::StrCat("shard ", i, " (", addresses[i], ") from step ", step));
    const v1::Membership& first = results[0]->membership();
    same = same && first.history_size() > 0 && m.history_size() > 0 &&
           first.history(first.history_size() - 1).step() == step;
  }
  if (same) return MergeJobInfos(results);
  return absl::AbortedError(absl::StrCat(
      "the membership change took effect at different steps on the shards (",
      absl::StrJoin(steps, ", "),
      "): their steps moved on while it was sent; name the step explicitly "
      "(at or above the job's next_step on every shard) to make them agree"));
}

}  // namespace

template <typename Request, typename Response, typename Call>
absl::StatusOr<Response> Client::UnaryOn(size_t shard, const Request& request,
                                         Call call,
                                         absl::Duration timeout) const {
  if (!address_status_.ok()) return address_status_;
  const Shard& target = shards_[shard];
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  grpc::Status status;
  Response response;
  for (;;) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    status = (target.stub.get()->*call)(&context, request, &response);
    // An UNAVAILABLE without details is gRPC's own: the connection broke
    // under the call (a server killed or restarting) or the server was not
    // reached. It is ridden out like an unreachable server, as every call
    // here is idempotent. The server's own errors carry details
    // (server/rpc/grpc_status.h) and are returned. The channel's state
    // cannot tell the two apart: when this call returns, it may not have
    // left READY yet, or be READY again (another call reconnected).
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        !status.error_details().empty() || absl::Now() + backoff >= deadline) {
      break;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
    response.Clear();
  }
  if (status.ok()) return response;
  absl::Status error = FromGrpcStatus(status);
  // Waited for the server the whole call and never reached it.
  if (error.code() == absl::StatusCode::kDeadlineExceeded &&
      target.channel->GetState(false) != GRPC_CHANNEL_READY) {
    error = absl::UnavailableError(
        absl::StrCat("the aggregator at ", target.address,
                     " is unreachable: ", error.message()));
  }
  if (shards_.size() == 1) return error;
  return absl::Status(error.code(),
                      absl::StrCat("shard ", shard, " (", target.address,
                                   "): ", error.message()));
}

template <typename Response>
std::vector<absl::StatusOr<Response>> Client::OnEveryShard(
    const std::function<absl::StatusOr<Response>(size_t)>& call) const {
  std::vector<absl::StatusOr<Response>> out(shards_.size(),
                                            absl::UnknownError("not run"));
  if (shards_.size() == 1) {
    out[0] = call(0);
    return out;
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < shards_.size(); ++i) {
    threads.emplace_back([&out, &call, i] { out[i] = call(i); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

v1::CreateJobRequest Client::ForShard(const v1::CreateJobRequest& request,
                                      size_t shard) const {
  v1::CreateJobRequest out = request;
  if (shards_.size() == 1) return out;
  v1::ShardAssignment* a = out.mutable_shard();
  a->Clear();
  a->set_shard(static_cast<int>(shard));
  a->set_num_shards(static_cast<int>(shards_.size()));
  for (int layer :
       OwnedLayers(request.job_id(), request.layers_size(),
                   static_cast<int>(shard), static_cast<int>(shards_.size()))) {
    a->add_owned_layers(layer);
  }
  return out;
}

absl::StatusOr<v1::JobInfo> Client::CreateJob(
    const v1::CreateJobRequest& request) {
  if (shards_.size() > 1) {
    // A job that trained on some shards and is gone from others lost its
    // state there: creating it again would start those shards empty and
    // hide the loss. (Missing on shards while nothing was applied is a
    // CreateJob that failed half way: repeating it is what finishes it.)
    if (absl::Status lost = CheckNotLost(request.job_id()); !lost.ok()) {
      return lost;
    }
  }
  return MergeJobInfos(OnEveryShard<v1::JobInfo>([&](size_t i) {
    return UnaryOn<v1::CreateJobRequest, v1::JobInfo>(
        i, ForShard(request, i), &v1::Aggregator::Stub::CreateJob);
  }));
}

absl::Status Client::CheckNotLost(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::JobInfo>([&](size_t i) {
    return UnaryOn<v1::GetJobRequest, v1::JobInfo>(
        i, request, &v1::Aggregator::Stub::GetJob);
  });
  std::vector<const v1::JobInfo*> by_shard;
  bool trained = false;
  for (const auto& r : results) {
    by_shard.push_back(r.ok() ? &*r : nullptr);
    trained =
        trained || (r.ok() && HoldsLayers(*r) && r->committed_step() >= 0);
  }
  if (!trained) return absl::OkStatus();
  const v1::JobInfo merged = MergeJobInfos(by_shard);
  if (merged.missing_shards_size() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", job_id, "' has trained on some shards but is gone from shard ",
      absl::StrJoin(merged.missing_shards(), ","),
      ", which lost its state; restore it from a backup (syncnormctl "
      "restore-backup NAME ",
      job_id,
      ") before training resumes: creating it would start there "
      "empty"));
}

absl::StatusOr<v1::JobInfo> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::JobInfo>([&](size_t i) {
    return UnaryOn<v1::GetJobRequest, v1::JobInfo>(
        i, request, &v1::Aggregator::Stub::GetJob);
  });
  if (results.size() == 1) return results[0];
  // NOT_FOUND from some shards only: the job is reported, with them missing.
  std::vector<const v1::JobInfo*> by_shard;
  for (const auto& r : results) {
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) {
      return r.status();
    }
    by_shard.push_back(r.ok() ? &*r : nullptr);
  }
  for (const v1::JobInfo* info : by_shard) {
    if (info != nullptr) return MergeJobInfos(by_shard);
  }
  return results[0].status();
}

absl::StatusOr<v1::StatsHealth> Client::GetStatsHealth(
    const std::string& job_id) {
  v1::GetStatsHealthRequest request;
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::StatsHealth>([&](size_t i) {
    return UnaryOn<v1::GetStatsHealthRequest, v1::StatsHealth>(
        i, request, &v1::Aggregator::Stub::GetStatsHealth);
  });
  if (results.size() == 1) return results[0];
  v1::StatsHealth merged;
  merged.set_job_id(job_id);
  std::vector<v1::HealthFlag> active, cleared;
  std::map<int, int64_t> refused;
  bool any = false;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (!r.ok()) {
      if (r.status().code() != absl::StatusCode::kNotFound) return r.status();
      merged.add_missing_shards(static_cast<int>(i));
      continue;
    }
    any = true;
    merged.set_enabled(merged.enabled() || r->enabled());
    for (const v1::HealthFlag& f : r->flags()) {
      (f.active() ? active : cleared).push_back(f);
    }
    merged.set_flags_in_force(merged.flags_in_force() + r->flags_in_force());
    for (const v1::RankRefusals& n : r->refused()) {
      refused[n.rank()] += n.nonfinite();
    }
    merged.set_nonfinite_total(merged.nonfinite_total() + r->nonfinite_total());
    merged.set_rounds_scored(merged.rounds_scored() + r->rounds_scored());
  }
  if (!any) return results[0].status();
  // As one server lists them: in force by layer, group, rank; then the
  // cleared, newest first.
  std::stable_sort(active.begin(), active.end(),
                   [](const v1::HealthFlag& a, const v1::HealthFlag& b) {
                     return std::make_tuple(a.layer(), a.group(), a.rank()) <
                            std::make_tuple(b.layer(), b.group(), b.rank());
                   });
  std::stable_sort(cleared.begin(), cleared.end(),
                   [](const v1::HealthFlag& a, const v1::HealthFlag& b) {
                     return a.cleared_step() > b.cleared_step();
                   });
  constexpr int kMaxListed = 256;
  for (const auto* list : {&active, &cleared}) {
    for (const v1::HealthFlag& f : *list) {
      if (merged.flags_size() >= kMaxListed) break;
      *merged.add_flags() = f;
    }
  }
  std::vector<std::pair<int, int64_t>> by_count(refused.begin(), refused.end());
  std::stable_sort(
      by_count.begin(), by_count.end(),
      [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [rank, n] : by_count) {
    if (merged.refused_size() >= kMaxListed) break;
    v1::RankRefusals* r = merged.add_refused();
    r->set_rank(rank);
    r->set_nonfinite(n);
  }
  return merged;
}

absl::Status Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::DeleteJobResponse>([&](size_t i) {
    return UnaryOn<v1::DeleteJobRequest, v1::DeleteJobResponse>(
        i, request, &v1::Aggregator::Stub::DeleteJob);
  });
  // A shard that no longer has the job was done by an earlier, partly
  // failed DeleteJob; NOT_FOUND only when no shard had it.
  bool deleted = false;
  for (const auto& r : results) {
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) {
      return r.status();
    }
    deleted = deleted || r.ok();
  }
  return deleted ? absl::OkStatus() : results[0].status();
}

absl::StatusOr<v1::RunningStats> Client::GetRunningStats(
    const v1::GetRunningStatsRequest& request) {
  if (shards_.size() == 1) {
    return UnaryOn<v1::GetRunningStatsRequest, v1::RunningStats>(
        0, request, &v1::Aggregator::Stub::GetRunningStats);
  }
  return GetRunningStatsSharded(request);
}

absl::StatusOr<v1::RunningStats> Client::GetRunningStatsSharded(
    const v1::GetRunningStatsRequest& request) {
  // Each shard is asked for the requested layers it holds (all it holds
  // when none are named); a shard holding none of them is not asked.
  std::vector<v1::GetRunningStatsRequest> asks(shards_.size(), request);
  std::vector<bool> ask(shards_.size(), request.layers_size() == 0);
  for (auto& a : asks) a.clear_layers();
  for (int layer : request.layers()) {
    const int shard = ShardOf(request.job_id(), layer);
    asks[shard].add_layers(layer);
    ask[shard] = true;
  }
  auto results = OnEveryShard<v1::RunningStats>(
      [&](size_t i) -> absl::StatusOr<v1::RunningStats> {
        if (!ask[i]) return v1::RunningStats();
        return UnaryOn<v1::GetRunningStatsRequest, v1::RunningStats>(
            i, asks[i], &v1::Aggregator::Stub::GetRunningStats);
      });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  v1::RunningStats out;
  out.set_job_id(request.job_id());
  int64_t step = INT64_MAX;
  std::map<int, const v1::LayerStats*> by_layer;
  for (const auto& r : results) {
    if (r->layers_size() == 0) continue;
    step = std::min(step, r->step());
    for (const v1::LayerStats& l : r->layers()) by_layer[l.layer()] = &l;
  }
  out.set_step(step == INT64_MAX ? -1 : step);
  if (request.layers_size() == 0) {
    for (const auto& [layer, stats] : by_layer) *out.add_layers() = *stats;
    return out;
  }
  for (int layer : request.layers()) {
    auto it = by_layer.find(layer);
    if (it == by_layer.end()) {
      return absl::InternalError(
          absl::StrCat("shard ", ShardOf(request.job_id(), layer),
                       " answered without layer ", layer));
    }
    *out.add_layers() = *it->second;
  }
  return out;
}

absl::StatusOr<std::vector<v1::JobInfo>> Client::ListJobs() {
  auto results = OnEveryShard<v1::ListJobsResponse>([&](size_t i) {
    return UnaryOn<v1::ListJobsRequest, v1::ListJobsResponse>(
        i, v1::ListJobsRequest(), &v1::Aggregator::Stub::ListJobs);
  });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  // by_id[job][i]: shard i's answer, null where it does not list the job.
  std::map<std::string, std::vector<const v1::JobInfo*>> by_id;
  for (size_t i = 0; i < results.size(); ++i) {
    for (const v1::JobInfo& job : results[i]->jobs()) {
      auto& slot = by_id[job.job_id()];
      slot.resize(results.size(), nullptr);
      slot[i] = &job;
    }
  }
  std::vector<v1::JobInfo> out;
  for (const auto& [id, infos] : by_id) {
    out.push_back(shards_.size() == 1 ? *infos[0] : MergeJobInfos(infos));
  }
  return out;
}

absl::StatusOr<v1::CheckpointInfo> Client::Checkpoint(
    const std::string& job_id, int64_t step, const std::string& tag,
    std::optional<absl::Duration> timeout) {
  v1::CheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_tag(tag);
  auto results = OnEveryShard<v1::CheckpointInfo>([&](size_t i) {
    return UnaryOn<v1::CheckpointRequest, v1::CheckpointInfo>(
        i, request, &v1::Aggregator::Stub::Checkpoint,
        timeout.value_or(options_.rpc_timeout));
  });
  if (absl::Status s = FirstJobError(results); !s.ok()) return s;
  v1::CheckpointInfo out = *results[0];
  for (const auto& r : results) {
    out.set_created_unix_ms(
        std::max(out.created_unix_ms(), r->created_unix_ms()));
  }
  return out;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> Client::ListCheckpoints(
    const std::string& job_id) {
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::ListCheckpointsResponse>([&](size_t i) {
    return UnaryOn<v1::ListCheckpointsRequest, v1::ListCheckpointsResponse>(
        i, request, &v1::Aggregator::Stub::ListCheckpoints);
  });
  if (absl::Status s = FirstJobError(results); !s.ok()) return s;
  // Only a checkpoint every shard has can be restored: list those.
  std::map<int64_t, int> shards_with;
  for (const auto& r : results) {
    for (const v1::CheckpointInfo& c : r->checkpoints())
      ++shards_with[c.step()];
  }
  std::vector<v1::CheckpointInfo> out;
  for (const v1::CheckpointInfo& c : results[0]->checkpoints()) {
    if (shards_with[c.step()] == static_cast<int>(shards_.size())) {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<v1::JobInfo> Client::RestoreCheckpoint(const std::string& job_id,
                                                      int64_t step) {
  v1::RestoreCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  auto results = OnEveryShard<v1::JobInfo>([&](size_t i) {
    return UnaryOn<v1::RestoreCheckpointRequest, v1::JobInfo>(
        i, request, &v1::Aggregator::Stub::RestoreCheckpoint);
  });
  if (absl::Status s = FirstJobError(results); !s.ok()) return s;
  return MergeJobInfos(results);
}

absl::StatusOr<v1::JobInfo> Client::UpdateMembership(
    const v1::UpdateMembershipRequest& request) {
  if (shards_.size() == 1) {
    return UnaryOn<v1::UpdateMembershipRequest, v1::JobInfo>(
        0, request, &v1::Aggregator::Stub::UpdateMembership);
  }
  if (request.step() != 0) {
    auto results = OnEveryShard<v1::JobInfo>([&](size_t i) {
      return UnaryOn<v1::UpdateMembershipRequest, v1::JobInfo>(
          i, request, &v1::Aggregator::Stub::UpdateMembership);
    });
    if (absl::Status s = FirstJobError(results); !s.ok()) return s;
    return MergeJobInfos(results);
  }
  // Step 0 means each server's own next step, which differs between shards
  // (each knows its own layers): every shard gets the highest, explicitly,
  // so that the change takes effect at the same step on all of them.
  v1::UpdateMembershipRequest explicit_step = request;
  int64_t tried = -1;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<v1::JobInfo> job = GetJob(request.job_id());
    if (!job.ok()) return job.status();
    explicit_step.set_step(job->next_step());
    auto results = OnEveryShard<v1::JobInfo>([&](size_t i) {
      return UnaryOn<v1::UpdateMembershipRequest, v1::JobInfo>(
          i, explicit_step, &v1::Aggregator::Stub::UpdateMembership);
    });
    absl::Status error = FirstJobError(results);
    if (error.ok()) return SameChangeEverywhere(results, shards());
    // A shard whose layers completed that step meanwhile refuses it; a
    // higher next step then is worth another try, the same one is not.
    if (error.code() != absl::StatusCode::kFailedPrecondition ||
        attempt >= kMembershipAttempts || job->next_step() <= tried) {
      return error;
    }
    tried = job->next_step();
  }
}

absl::StatusOr<v1::RunningStats> Client::SetRunningStats(
    const v1::SetRunningStatsRequest& request) {
  if (shards_.size() == 1 || request.layers_size() == 0) {
    return UnaryOn<v1::SetRunningStatsRequest, v1::RunningStats>(
        0, request, &v1::Aggregator::Stub::SetRunningStats);
  }
  // Each entry to the shard of its layer; answers in the request's order.
  std::vector<v1::SetRunningStatsRequest> parts(shards_.size());
  std::vector<std::vector<int>> positions(shards_.size());
  for (int i = 0; i < request.layers_size(); ++i) {
    const int shard = ShardOf(request.job_id(), request.layers(i).layer());
    parts[shard].set_job_id(request.job_id());
    *parts[shard].add_layers() = request.layers(i);
    positions[shard].push_back(i);
  }
  auto results = OnEveryShard<v1::RunningStats>(
      [&](size_t i) -> absl::StatusOr<v1::RunningStats> {
        if (positions[i].empty()) return v1::RunningStats();
        return UnaryOn<v1::SetRunningStatsRequest, v1::RunningStats>(
            i, parts[i], &v1::Aggregator::Stub::SetRunningStats);
      });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  std::vector<const v1::LayerStats*> ordered(request.layers_size());
  v1::RunningStats out;
  out.set_job_id(request.job_id());
  int64_t step = INT64_MAX;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (positions[s].empty()) continue;
    if (results[s]->layers_size() != static_cast<int>(positions[s].size())) {
      return absl::InternalError(
          absl::StrCat("shard ", s, " answered ", results[s]->layers_size(),
                       " layers for ", positions[s].size()));
    }
    step = std::min(step, results[s]->step());
    for (size_t k = 0; k < positions[s].size(); ++k) {
      ordered[positions[s][k]] = &results[s]->layers(static_cast<int>(k));
    }
  }
  out.set_step(step);
  for (const v1::LayerStats* l : ordered) *out.add_layers() = *l;
  return out;
}

absl::StatusOr<std::vector<v1::BackupInfo>> Client::Backup(
    const std::string& name, const std::string& job_id,
    std::optional<absl::Duration> timeout) {
  v1::BackupRequest request;
  // Chosen here, so that every shard's copy has the same name.
  request.set_name(name.empty() ? absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                                   absl::UTCTimeZone())
                                : name);
  request.set_job_id(job_id);
  auto results = OnEveryShard<v1::BackupInfo>([&](size_t i) {
    v1::BackupRequest mine = request;
    mine.set_shard(static_cast<int>(i));
    return UnaryOn<v1::BackupRequest, v1::BackupInfo>(
        i, mine, &v1::Aggregator::Stub::Backup,
        timeout.value_or(options_.rpc_timeout));
  });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  std::vector<v1::BackupInfo> out;
  for (auto& r : results) out.push_back(*std::move(r));
  return out;
}

absl::StatusOr<std::vector<v1::BackupInfo>> Client::ListBackups() {
  auto results = OnEveryShard<v1::ListBackupsResponse>([&](size_t i) {
    v1::ListBackupsRequest request;
    request.set_shard(static_cast<int>(i));
    return UnaryOn<v1::ListBackupsRequest, v1::ListBackupsResponse>(
        i, request, &v1::Aggregator::Stub::ListBackups);
  });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  if (results.size() == 1) {
    return std::vector<v1::BackupInfo>(results[0]->backups().begin(),
                                       results[0]->backups().end());
  }
  std::map<std::string, std::vector<const v1::BackupInfo*>> by_name;
  for (size_t i = 0; i < results.size(); ++i) {
    for (const v1::BackupInfo& b : results[i]->backups()) {
      auto& slot = by_name[b.name()];
      slot.resize(results.size(), nullptr);
      slot[i] = &b;
    }
  }
  std::vector<v1::BackupInfo> out;
  for (const auto& [name, by_shard] : by_name) {
    out.push_back(MergeBackups(by_shard));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const v1::BackupInfo& a, const v1::BackupInfo& b) {
                     return a.created_unix_ms() < b.created_unix_ms();
                   });
  return out;
}

absl::StatusOr<std::vector<v1::RestoreBackupResponse>> Client::RestoreBackup(
    const std::string& name, const std::string& job_id, bool replace,
    std::optional<absl::Duration> timeout) {
  auto results = OnEveryShard<v1::RestoreBackupResponse>([&](size_t i) {
    v1::RestoreBackupRequest request;
    request.set_name(name);
    request.set_job_id(job_id);
    request.set_shard(static_cast<int>(i));
    request.set_replace(replace);
    return UnaryOn<v1::RestoreBackupRequest, v1::RestoreBackupResponse>(
        i, request, &v1::Aggregator::Stub::RestoreBackup,
        timeout.value_or(options_.rpc_timeout));
  });
  if (absl::Status s = FirstError(results); !s.ok()) return s;
  std::vector<v1::RestoreBackupResponse> out;
  for (auto& r : results) out.push_back(*std::move(r));
  return out;
}

}  // namespace syncnorm
