#include "server/domain/aggregator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/log.h"

namespace syncnorm {
namespace {

void LogJobCreated(const JobSpec& spec) {
  LogLine line("job_created");
  line.Add("job", BoundedText(spec.job_id))
      .Add("world_size", spec.world_size)
      .Add("group_size", spec.group_size)
      .Add("groups", spec.num_groups())
      .Add("layers", spec.layers.size())
      .Add("round_timeout_ms", absl::ToInt64Milliseconds(spec.round_timeout));
  if (spec.shard.sharded()) {
    line.Add("shard", spec.shard.shard)
        .Add("num_shards", spec.shard.num_shards)
        .Add("owned_layers", spec.shard.owned_layers.size());
  }
}

}  // namespace

Aggregator::Aggregator(AggregatorOptions options, const Clock* clock,
                       StateStore* store)
    : options_(std::move(options)),
      clock_(clock),
      observer_(options_.observer != nullptr ? options_.observer
                                             : &default_observer_),
      store_(store) {}

JobOptions Aggregator::JobOptionsOf() const {
  JobOptions o;
  o.recent_rounds = options_.recent_rounds;
  o.keep_checkpoints = options_.keep_checkpoints;
  o.observer = observer_;
  o.straggler_threshold = options_.straggler_threshold;
  return o;
}

absl::Status Aggregator::Load() {
  absl::StatusOr<std::vector<StoredJob>> stored = store_->LoadAll();
  if (!stored.ok()) return stored.status();
  absl::MutexLock lock(&jobs_mu_);
  for (const StoredJob& s : *stored) {
    auto job = std::make_shared<Job>(s.spec, JobOptionsOf(), store_, clock_);
    job->Load(s);
    jobs_[s.spec.job_id] = std::move(job);
  }
  return absl::OkStatus();
}

Aggregator::~Aggregator() {
  StopReaper();
  // Keeps the exactly-once promise of Contribute: nobody waits forever.
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&jobs_mu_);
    jobs.swap(jobs_);
  }
  for (const auto& [id, job] : jobs) {
    job->Abort(absl::UnavailableError(
        "the aggregator is shutting down; retry against a running server"));
  }
  observer_->OnTick(absl::InfiniteFuture());  // what it holds back, said
}

void Aggregator::StartReaper() {
  absl::MutexLock lock(&reaper_mu_);
  if (reaper_ != nullptr) return;
  reaper_ = std::make_unique<PeriodicThread>(
      options_.reaper_period, [this] { ExpireRounds(clock_->Now()); });
}

void Aggregator::StopReaper() {
  std::unique_ptr<PeriodicThread> reaper;
  {
    absl::MutexLock lock(&reaper_mu_);
    reaper = std::move(reaper_);
  }
  reaper.reset();  // joins, outside reaper_mu_
}

absl::Status Aggregator::NotFound(absl::string_view job_id) {
  // No job has an id longer than kBoundedTextBytes (CreateJob refuses it).
  return absl::NotFoundError(
      absl::StrCat("job '", BoundedText(job_id), "' not found; ",
                   job_id.size() > kBoundedTextBytes
                       ? absl::StrCat("job ids have at most ",
                                      kBoundedTextBytes, " characters")
                       : "create it with CreateJob first"));
}

std::shared_ptr<Job> Aggregator::FindJob(absl::string_view job_id) const {
  absl::ReaderMutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<JobSnapshot> Aggregator::CreateJob(JobSpec spec) {
  if (absl::Status s = CheckNewNames(spec); !s.ok()) return s;
  absl::StatusOr<JobSpec> resolved =
      ResolveJobSpec(std::move(spec), options_.default_round_timeout);
  if (!resolved.ok()) return resolved.status();
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(resolved->job_id);
    if (it != jobs_.end()) {
      if (!it->second->SameSpec(*resolved)) {
        return absl::AlreadyExistsError(
            absl::StrCat("job '", BoundedText(resolved->job_id),
                         "' already exists with a different "
                         "spec; delete it first or choose another job_id"));
      }
      job = it->second;
    } else {
      if (options_.limits.max_jobs > 0 &&
          jobs_.size() >= static_cast<size_t>(options_.limits.max_jobs)) {
        return LimitExceeded(
            absl::StrCat("a new job: ", jobs_.size(), " jobs on this server"),
            "max_jobs", options_.limits.max_jobs);
      }
      if (absl::Status s = CheckJobLimits(*resolved, options_.limits);
          !s.ok()) {
        return s;
      }
      // Stored first: a job that cannot be stored is not created.
      if (absl::Status s = store_->PutJob(*resolved); !s.ok()) return s;
      const std::string id = resolved->job_id;
      job = std::make_shared<Job>(*std::move(resolved), JobOptionsOf(), store_,
                                  clock_);
      jobs_.emplace(id, job);
      LogJobCreated(job->spec());
    }
  }
  return job->Snapshot();
}

absl::StatusOr<JobSnapshot> Aggregator::GetJob(absl::string_view job_id) const {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  return job->Snapshot();
}

int64_t Aggregator::job_count() const {
  absl::ReaderMutexLock lock(&jobs_mu_);
  return static_cast<int64_t>(jobs_.size());
}

std::vector<JobSnapshot> Aggregator::ListJobs() const {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::ReaderMutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  std::vector<JobSnapshot> out;
  for (const auto& job : jobs) out.push_back(job->Snapshot());
  std::sort(out.begin(), out.end(),
            [](const JobSnapshot& a, const JobSnapshot& b) {
              return a.spec.job_id < b.spec.job_id;
            });
  return out;
}

absl::Status Aggregator::DeleteJob(absl::string_view job_id) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return NotFound(job_id);
    // Under jobs_mu_, so that a CreateJob of the same id comes after the
    // removal from the store.
    if (absl::Status s = it->second->Delete(); !s.ok()) return s;
    job = std::move(it->second);
    jobs_.erase(it);
  }
  job->Abort(absl::AbortedError(
      absl::StrCat("job deleted: '", BoundedText(job_id),
                   "' was deleted while the round was waiting; "
                   "create the job again to continue")));
  LogLine("job_deleted").Add("job", BoundedText(job_id));
  return absl::OkStatus();
}

absl::StatusOr<RunningStatsSnapshot> Aggregator::GetRunningStats(
    absl::string_view job_id, absl::Span<const int> layers, int group,
    std::optional<int64_t> checkpoint_step) const {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  if (checkpoint_step.has_value()) {
    return job->CheckpointStats(*checkpoint_step, layers, group);
  }
  return job->Stats(layers, group);
}

absl::StatusOr<std::optional<StatsHealthSnapshot>> Aggregator::GetStatsHealth(
    absl::string_view job_id, int limit) const {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  if (job->health() == nullptr) return std::optional<StatsHealthSnapshot>();
  return std::optional<StatsHealthSnapshot>(job->health()->Snapshot(limit));
}

absl::StatusOr<std::vector<LayerStatsSnapshot>> Aggregator::SetRunningStats(
    absl::string_view job_id, std::vector<LayerStatsSnapshot> layers) {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  return job->SetStats(std::move(layers));
}

void Aggregator::Checkpoint(absl::string_view job_id, int64_t step,
                            std::string tag, absl::Time deadline,
                            CheckpointCallback done) {
  if (absl::Status s = CheckTag(tag); !s.ok()) {
    done(s);
    return;
  }
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) {
    done(NotFound(job_id));
    return;
  }
  deadline = std::min(deadline, clock_->Now() + options_.max_checkpoint_wait);
  job->Checkpoint(step, std::move(tag), deadline, std::move(done));
}

absl::StatusOr<std::vector<CheckpointMeta>> Aggregator::ListCheckpoints(
    absl::string_view job_id) const {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  return job->ListCheckpoints();
}

absl::StatusOr<JobSnapshot> Aggregator::RestoreCheckpoint(
    absl::string_view job_id, int64_t step) {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  absl::StatusOr<JobSnapshot> restored = job->Restore(step);
  if (restored.ok()) {
    LogLine("job_restored").Add("job", BoundedText(job_id)).Add("step", step);
  }
  return restored;
}

absl::StatusOr<JobSnapshot> Aggregator::UpdateMembership(
    absl::string_view job_id, const MembershipRequest& request) {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (job == nullptr) return NotFound(job_id);
  return job->UpdateMembership(request);
}

absl::StatusOr<std::vector<JobRestore>> Aggregator::RestoreJobs(
    std::vector<JobImage> images, bool replace, absl::string_view source) {
  std::vector<JobRestore> out;
  std::vector<std::shared_ptr<Job>> replaced;
  absl::Status status;
  {
    absl::MutexLock lock(&jobs_mu_);
    status = RestoreJobsLocked(images, replace, source, out, replaced);
  }
  for (const std::shared_ptr<Job>& job : replaced) {
    job->Abort(absl::AbortedError(absl::StrCat(
        "job '", BoundedText(job->spec().job_id),
        "' was replaced by its copy in backup '", BoundedText(source),
        "'; resume from the restored state (GetJob tells its committed "
        "step)")));
  }
  if (!status.ok()) return status;
  return out;
}

absl::Status Aggregator::RestoreJobsLocked(
    std::vector<JobImage>& images, bool replace, absl::string_view source,
    std::vector<JobRestore>& out, std::vector<std::shared_ptr<Job>>& replaced) {
  // The limits first, so that they refuse before anything is loaded.
  size_t added = 0;
  for (const JobImage& image : images) {
    if (jobs_.contains(image.job.spec.job_id)) continue;
    ++added;
    if (absl::Status s = CheckJobLimits(image.job.spec, options_.limits);
        !s.ok()) {
      return s;
    }
  }
  if (options_.limits.max_jobs > 0 &&
      jobs_.size() + added > static_cast<size_t>(options_.limits.max_jobs)) {
    return LimitExceeded(absl::StrCat("restoring ", added, " jobs beside the ",
                                      jobs_.size(), " on this server"),
                         "max_jobs", options_.limits.max_jobs);
  }
  for (JobImage& image : images) {
    const std::string id = image.job.spec.job_id;
    auto it = jobs_.find(id);
    const bool held = it != jobs_.end();
    JobRestore result{id, false, -1, ""};
    if (held && !replace) {
      result.committed_step = it->second->ReportedCommittedStep();
      result.note = absl::StrCat(
          "kept: the server holds this job (committed step ",
          result.committed_step, "); replace it to load the backup's copy");
      out.push_back(std::move(result));
      continue;
    }
    if (held) {
      result.note =
          absl::StrCat("replaced the job the server held (committed step ",
                       it->second->ReportedCommittedStep(), ")");
      // Under the old job's locks: none of its rounds stores anything after
      // the image is written.
      if (absl::Status s = it->second->Delete(&image); !s.ok()) return s;
      replaced.push_back(std::move(it->second));
      jobs_.erase(it);
    } else if (absl::Status s = store_->PutJobImage(image); !s.ok()) {
      return s;
    }
    auto job =
        std::make_shared<Job>(image.job.spec, JobOptionsOf(), store_, clock_);
    job->Load(image.job);
    result.restored = true;
    result.committed_step = job->ReportedCommittedStep();
    jobs_[id] = std::move(job);
    LogLine("job_restored_from_backup")
        .Add("job", BoundedText(id))
        .Add("backup", BoundedText(source))
        .Add("committed_step", result.committed_step)
        .Add("checkpoints", image.checkpoints.size())
        .Add("replaced", held ? "true" : "false");
    out.push_back(std::move(result));
  }
  return absl::OkStatus();
}

void Aggregator::Contribute(Contribution c, RoundCallback done) {
  std::shared_ptr<Job> job = FindJob(c.job_id);
  absl::Status status = job == nullptr ? NotFound(c.job_id) : job->Validate(c);
  if (!status.ok()) {
    RoundOutcome outcome;
    outcome.status = std::move(status);
    done(outcome);
    return;
  }
  RoundAdmission::Key key;
  // The job goes by its own id from here on, so c's (the same) moves
  // rather than being copied for every contribution.
  key.job_id = std::move(c.job_id);
  key.group = job->GroupOf(c.rank);
  key.layer = c.layer;
  key.step = c.step;
  key.phase = static_cast<int>(c.phase);
  if (absl::Status admitted = admission_.Enter(key); !admitted.ok()) {
    RoundOutcome outcome;
    outcome.status = std::move(admitted);
    done(outcome);
    return;
  }
  job->Contribute(
      std::move(c),
      [this, key = std::move(key),
       done = std::move(done)](const RoundOutcome& outcome) {
        done(outcome);
        admission_.Leave(key);
      },
      clock_->Now());
}

void Aggregator::ExpireRounds(absl::Time now) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::ReaderMutexLock lock(&jobs_mu_);
    jobs.reserve(jobs_.size());
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  for (const auto& job : jobs) job->Expire(now);
  observer_->OnTick(now);
}

}  // namespace syncnorm
