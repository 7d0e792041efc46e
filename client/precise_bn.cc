#include "client/precise_bn.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/job_groups.h"
#include "client/job_membership.h"
#include "kernels/formulas.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

// The longest job id the aggregator takes (server/domain/job_spec.cc).
constexpr size_t kMaxJobIdLength = 128;

// FNV-1a, 64 bits: a hash that is the same in every process and build
// (absl::Hash is not), for the scratch job's id.
uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The members of group `group` of `job`, ascending: its ranks that are
// among the latest members (every rank of a job that is not elastic).
std::vector<int> GroupMembers(const v1::JobInfo& job, int group) {
  std::vector<int> ranks;
  if (job.groups_size() > 0) {
    ranks.assign(job.groups(group).ranks().begin(),
                 job.groups(group).ranks().end());
  } else {
    const int k = job.group_size() > 0 ? job.group_size() : job.world_size();
    for (int r = group * k; r < (group + 1) * k; ++r) ranks.push_back(r);
  }
  if (!job.has_membership()) return ranks;
  const RankSet members = Members(job.membership());
  if (members.empty()) return ranks;  // a server without membership
  std::vector<int> out;
  for (int r : ranks) {
    if (members.contains(r)) out.push_back(r);
  }
  return out;
}

// The scratch job of one group: the job's rank space with the group's
// members as its only members, so that its rounds wait for exactly the
// ranks the group's training rounds wait for, named by their job ranks.
// No quorum, no staleness and no statistics health: a merge counts every
// member. Its layers keep no running statistics (the rounds only merge; a
// layer seen once is no error there) and the last one is Commit's barrier.
v1::CreateJobRequest ScratchSpec(const v1::JobInfo& job,
                                 const std::string& scratch_id,
                                 const std::vector<int>& members) {
  v1::CreateJobRequest spec;
  spec.set_job_id(scratch_id);
  spec.set_world_size(job.world_size());
  spec.set_round_timeout_ms(job.round_timeout_ms());
  // A rank's pooled batches are no training round: nothing to watch.
  spec.set_disable_stats_health(true);
  if (members.size() != static_cast<size_t>(job.world_size())) {
    for (int r : members) spec.add_members(r);
  }
  for (const v1::LayerSpec& layer : job.layers()) {
    v1::LayerSpec* scratch = spec.add_layers();
    scratch->set_name(layer.name());
    scratch->set_num_features(layer.num_features());
    scratch->set_no_running_stats(true);
  }
  v1::LayerSpec* barrier = spec.add_layers();
  barrier->set_name("precise-bn.barrier");
  barrier->set_num_features(1);
  barrier->set_no_running_stats(true);
  return spec;
}

}  // namespace

std::string PreciseBn::ScratchJobId(const std::string& job_id, int64_t serial,
                                    int group) {
  const std::string tail = absl::StrCat(".precise-bn.", serial, ".g", group);
  if (job_id.size() + tail.size() <= kMaxJobIdLength) return job_id + tail;
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016" PRIx64, Fnv1a(job_id));
  const std::string marked = absl::StrCat(".", hash, tail);
  return job_id.substr(0, kMaxJobIdLength - marked.size()) + marked;
}

absl::StatusOr<std::unique_ptr<PreciseBn>> PreciseBn::Start(
    Client& client, const std::string& job_id, int rank, int64_t serial) {
  absl::StatusOr<v1::JobInfo> job = client.GetJob(job_id);
  if (!job.ok()) return job.status();
  absl::StatusOr<int> group = GroupOf(*job, rank);
  if (!group.ok()) return group.status();
  const std::vector<int> members = GroupMembers(*job, *group);
  if (std::find(members.begin(), members.end(), rank) == members.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is not a member of job '", job_id,
                     "'; precise BN runs on its members"));
  }
  v1::GetRunningStatsRequest read;
  read.set_job_id(job_id);
  read.set_group(*group);
  absl::StatusOr<v1::RunningStats> stats = client.GetRunningStats(read);
  if (!stats.ok()) return stats.status();
  const std::string scratch_id = ScratchJobId(job_id, serial, *group);
  absl::StatusOr<v1::JobInfo> scratch =
      client.CreateJob(ScratchSpec(*job, scratch_id, members));
  if (!scratch.ok()) return scratch.status();
  if (scratch->next_step() > 0) {
    // No round of a new precise BN completes before every member, this
    // rank too, has started it: this one is an earlier one's that did not
    // end.
    return absl::FailedPreconditionError(absl::StrCat(
        "the scratch job '", scratch_id, "' of precise BN ", serial,
        " of job '", job_id,
        "' exists with rounds done: an earlier precise BN that did not end "
        "left it; delete it (syncnormctl delete-job) or pass another "
        "serial"));
  }
  return std::unique_ptr<PreciseBn>(new PreciseBn(
      client, job_id, rank, *group, members.front(), scratch_id,
      StartLayers(*job, *stats), client.NewNodeGroup(scratch_id, rank)));
}

std::vector<PreciseBn::Layer> PreciseBn::StartLayers(
    const v1::JobInfo& job, const v1::RunningStats& stats) {
  std::vector<Layer> layers(job.layers_size());
  for (int l = 0; l < job.layers_size(); ++l) {
    layers[l].name = job.layers(l).name();
    layers[l].channels = job.layers(l).num_features();
  }
  for (const v1::LayerStats& s : stats.layers()) {
    if (s.layer() >= 0 && s.layer() < job.layers_size()) {
      layers[s.layer()].start = s;
    }
  }
  return layers;
}

PreciseBn::PreciseBn(Client& client, std::string job_id, int rank, int group,
                     int committer, std::string scratch_id,
                     std::vector<Layer> layers,
                     std::unique_ptr<NodeGroup> scratch)
    : client_(client),
      job_id_(std::move(job_id)),
      rank_(rank),
      group_(group),
      committer_(committer),
      scratch_id_(std::move(scratch_id)),
      layers_(std::move(layers)),
      scratch_(std::move(scratch)) {}

absl::Status PreciseBn::Failed(const std::string& where, const absl::Status& s,
                               const std::string& outcome) const {
  absl::Status out(
      s.code(), absl::StrCat("precise BN of job '", job_id_, "' failed ", where,
                             ": ", s.message(), "; ", outcome));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

absl::StatusOr<RunningStats> PreciseBn::Merge(int layer,
                                              const Moments& pooled_local) {
  constexpr char kUnchanged[] =
      "nothing was changed: the job's running statistics are as they were";
  if (layer < 0 || layer >= num_layers()) {
    return Failed(absl::StrCat("at layer ", layer),
                  absl::InvalidArgumentError(
                      absl::StrCat("the job has layers 0..", num_layers() - 1)),
                  kUnchanged);
  }
  Layer& l = layers_[layer];
  const std::string where = absl::StrCat("at layer ", layer, " ('", l.name,
                                         "', scratch job '", scratch_id_, "')");
  if (l.merged.has_value()) {
    return Failed(where,
                  absl::FailedPreconditionError("the layer is merged already"),
                  kUnchanged);
  }
  if (absl::Status s = ValidateMoments(pooled_local, l.channels); !s.ok()) {
    return Failed(where, s, kUnchanged);
  }
  absl::StatusOr<ForwardReply> reply =
      scratch_->SyncForward(layer, /*step=*/0, pooled_local);
  if (absl::IsAborted(reply.status())) {
    return Failed(
        where, reply.status(),
        absl::StrCat("another rank's precise BN failed and ended it (see "
                     "its error); ",
                     kUnchanged));
  }
  if (!reply.ok()) return Failed(where, reply.status(), kUnchanged);
  const GlobalMoments& g = reply->global;
  if (g.count == 0) {  // no member saw the layer: it keeps its statistics
    l.merged = FromProto(l.start);
    return *l.merged;
  }
  if (g.count == 1) {
    return Failed(where,
                  absl::FailedPreconditionError(
                      "the group's batches hold 1 value per channel of its "
                      "input, and the unbiased variance M2 / (N - 1) needs "
                      "at least 2"),
                  kUnchanged);
  }
  RunningStats stats;
  stats.num_batches_tracked = l.start.num_batches_tracked() + 1;
  stats.mean = g.mean;
  stats.var.resize(g.var.size());
  // The aggregator's var is M2 / N; the population's unbiased variance is
  // the running-statistics rule's sample var of it (formulas.h, the one
  // place that turns a biased var into the running var).
  const double n = static_cast<double>(g.count);
  for (size_t c = 0; c < g.var.size(); ++c) {
    stats.var[c] = RunningVarSample(n, g.var[c], /*biased=*/false);
  }
  l.count = g.count;
  l.merged = stats;
  return stats;
}

int64_t PreciseBn::population_count(int layer) const {
  if (layer < 0 || layer >= num_layers()) return 0;
  return layers_[layer].count;
}

absl::Status PreciseBn::WriteStats() {
  v1::SetRunningStatsRequest request;
  request.set_job_id(job_id_);
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& l = layers_[i];
    if (l.count < 2) continue;
    v1::LayerStats* entry = request.add_layers();
    entry->set_layer(i);
    entry->set_group(group_);
    entry->set_name(l.name);
    entry->set_frozen(l.start.frozen());
    ToProto(*l.merged, *entry);
  }
  if (request.layers_size() == 0) return absl::OkStatus();
  return client_.SetRunningStats(request).status();
}

absl::StatusOr<bool> PreciseBn::Barrier(bool failed) {
  // Each member sends one value: 1 from a committer that failed, else 0.
  // Their mean is 0 exactly when the statistics were written.
  Moments flag;
  flag.count = 1;
  flag.mean = {failed ? 1.0 : 0.0};
  flag.m2 = {0.0};
  absl::StatusOr<ForwardReply> reply =
      scratch_->SyncForward(num_layers(), /*step=*/0, flag);
  if (!reply.ok()) return reply.status();
  return reply->global.mean.at(0) != 0.0;
}

absl::Status PreciseBn::Commit() {
  if (committed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "precise BN of job '", job_id_, "': Commit was called already"));
  }
  committed_ = true;
  const bool writer = rank_ == committer_;
  absl::Status written = writer ? WriteStats() : absl::OkStatus();
  absl::StatusOr<bool> failed = Barrier(!written.ok());
  if (!written.ok()) {
    Abort().IgnoreError();  // it failed: the scratch job goes
    return Failed(
        "writing the statistics", written,
        "with several shards some layers may hold the new statistics");
  }
  if (!failed.ok()) {
    Abort().IgnoreError();
    return Failed(
        "at the barrier after the commit", failed.status(),
        writer ? "the job holds the new statistics (this rank wrote them)"
               : absl::StrCat("the job holds the new statistics if rank ",
                              committer_, " wrote them: read them back"));
  }
  if (*failed) {
    Abort().IgnoreError();
    return absl::AbortedError(
        absl::StrCat("precise BN of job '", job_id_, "' failed: rank ",
                     committer_, ", which writes the statistics of group ",
                     group_, ", could not write them (see its error)"));
  }
  if (!writer) return absl::OkStatus();
  if (absl::Status s = client_.DeleteJob(scratch_id_); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("precise BN of job '", job_id_,
                                     "': the job holds the new statistics, but "
                                     "deleting the scratch job '",
                                     scratch_id_, "' failed: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status PreciseBn::Abort() {
  absl::Status s = client_.DeleteJob(scratch_id_);
  if (s.ok() || absl::IsNotFound(s)) return absl::OkStatus();
  return s;
}

}  // namespace syncnorm
