#include "server/rpc/proto_convert.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/repeated_field.h"
#include "wire/convert.h"
#include "wire/rank_set.h"
#include "wire/round_error.h"

namespace syncnorm {
namespace {

std::vector<double> ToVector(const google::protobuf::RepeatedField<double>& f) {
  return std::vector<double>(f.begin(), f.end());
}

void ToRepeated(const std::vector<double>& v,
                google::protobuf::RepeatedField<double>* f) {
  f->Assign(v.begin(), v.end());
}

LayerConfig LayerFromProto(const v1::LayerSpec& spec) {
  LayerConfig layer;
  layer.name = spec.name();
  layer.channels = spec.num_features();
  layer.rule = RuleFromProto(spec);
  layer.initial_running_mean = ToVector(spec.initial_running_mean());
  layer.initial_running_var = ToVector(spec.initial_running_var());
  return layer;
}

void LayerToProto(const LayerConfig& layer, v1::LayerSpec& spec) {
  spec.set_name(layer.name);
  spec.set_num_features(layer.channels);
  ToProto(layer.rule, spec);
  ToRepeated(layer.initial_running_mean, spec.mutable_initial_running_mean());
  ToRepeated(layer.initial_running_var, spec.mutable_initial_running_var());
}

}  // namespace

JobSpec JobSpecFromProto(const v1::CreateJobRequest& request) {
  JobSpec spec;
  spec.job_id = request.job_id();
  spec.world_size = request.world_size();
  spec.group_size = request.group_size();
  spec.round_timeout = absl::Milliseconds(request.round_timeout_ms());
  for (const v1::LayerSpec& layer : request.layers()) {
    spec.layers.push_back(LayerFromProto(layer));
  }
  for (const v1::RankGroup& group : request.groups()) {
    spec.groups.emplace_back(group.ranks().begin(), group.ranks().end());
  }
  spec.quorum.min_ranks = request.quorum().min_ranks();
  spec.quorum.grace = absl::Milliseconds(request.quorum().grace_ms());
  if (request.has_shard()) {
    spec.shard.shard = request.shard().shard();
    spec.shard.num_shards = request.shard().num_shards();
    spec.shard.owned_layers.assign(request.shard().owned_layers().begin(),
                                   request.shard().owned_layers().end());
  }
  spec.members.assign(request.members().begin(), request.members().end());
  spec.staleness = request.staleness();
  spec.stats_health = !request.disable_stats_health();
  return spec;
}

MembershipRequest MembershipRequestFromProto(
    const v1::UpdateMembershipRequest& request) {
  MembershipRequest r;
  r.step = request.step();
  r.join.assign(request.join().begin(), request.join().end());
  r.leave.assign(request.leave().begin(), request.leave().end());
  r.remove.assign(request.remove().begin(), request.remove().end());
  return r;
}

void JobInfoToProto(const JobSnapshot& job, v1::JobInfo& info) {
  const JobSpec& spec = job.spec;
  info.set_job_id(spec.job_id);
  info.set_world_size(spec.world_size);
  info.set_group_size(spec.group_size);
  info.set_round_timeout_ms(absl::ToInt64Milliseconds(spec.round_timeout));
  info.set_committed_step(job.committed_step);
  for (const LayerConfig& layer : spec.layers) {
    LayerToProto(layer, *info.add_layers());
  }
  for (const std::vector<int>& group : spec.groups) {
    info.add_groups()->mutable_ranks()->Assign(group.begin(), group.end());
  }
  if (spec.quorum.enabled()) {
    info.mutable_quorum()->set_min_ranks(spec.quorum.min_ranks);
    info.mutable_quorum()->set_grace_ms(
        absl::ToInt64Milliseconds(spec.quorum.grace));
  }
  if (spec.shard.sharded()) {
    v1::ShardAssignment* shard = info.mutable_shard();
    shard->set_shard(spec.shard.shard);
    shard->set_num_shards(spec.shard.num_shards);
    for (int layer : spec.shard.owned_layers) shard->add_owned_layers(layer);
  }
  info.set_next_step(job.next_step);
  info.set_accepts_relay_blocks(true);
  info.set_staleness(spec.staleness);
  info.set_disable_stats_health(!spec.stats_health);
  if (!job.membership.empty()) {
    MembershipToProto(job.membership, *info.mutable_membership());
  }
}

void MembershipToProto(const std::vector<MembershipChange>& history,
                       v1::Membership& m) {
  // The rank lists too, for readers written before runs, while they stay
  // small (v1::Membership).
  const MembershipChange& latest = history.back();
  int64_t listed = latest.members.size();
  for (const MembershipChange& c : history) {
    listed +=
        c.members.size() + c.joined.size() + c.left.size() + c.removed.size();
  }
  const bool lists = listed <= kMaxListedRanks;
  const auto put = [&](const RankSet& set,
                       google::protobuf::RepeatedField<int32_t>* list,
                       google::protobuf::RepeatedField<int32_t>* runs) {
    AddFlatRuns(set, runs);
    if (lists) list->Assign(set.begin(), set.end());
  };
  m.set_version(latest.version);
  put(latest.members, m.mutable_members(), m.mutable_member_runs());
  for (const MembershipChange& c : history) {
    v1::MembershipChange* out = m.add_history();
    out->set_version(c.version);
    out->set_step(c.step);
    put(c.members, out->mutable_members(), out->mutable_member_runs());
    put(c.joined, out->mutable_joined(), out->mutable_joined_runs());
    put(c.left, out->mutable_left(), out->mutable_left_runs());
    put(c.removed, out->mutable_removed(), out->mutable_removed_runs());
    out->set_restored(c.restored);
  }
}

Contribution ContributionFromProto(v1::Contribution&& proto) {
  Contribution c;
  c.job_id = std::move(*proto.mutable_job_id());
  c.layer = proto.layer();
  c.step = proto.step();
  c.phase = static_cast<Phase>(proto.phase());
  c.rank = proto.rank();
  c.backward = proto.backward_index();
  c.round_age = absl::Milliseconds(proto.round_age_ms());
  c.update = RoundUpdateFromProto(proto);
  if (proto.has_moments()) {
    c.payload = FromProto(proto.moments());
  } else if (proto.has_grad_sums()) {
    c.payload = FromProto(proto.grad_sums());
  }
  return c;
}

namespace {

// RelayBlock.health into `out`; an absent score becomes NaN (not scored),
// so one sent as a NaN or an infinity is refused here. Which ranks and
// steps an entry may name is the domain's to check (it knows the block's
// round).
absl::Status RankHealthFromProto(const v1::RelayBlock& proto,
                                 std::vector<RankHealth>& out) {
  out.reserve(proto.health_size());
  for (int i = 0; i < proto.health_size(); ++i) {
    const v1::RankHealth& h = proto.health(i);
    const auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("Contribution.relay.health[", i, "] (rank ", h.rank(),
                       ", step ", h.step(), "): ", what,
                       "; a relay leaves out a score it could not compute"));
    };
    if (h.has_mean_shift() && !std::isfinite(h.mean_shift())) {
      return bad(absl::StrCat("mean_shift is ", h.mean_shift()));
    }
    if (h.has_variance_ratio() && !std::isfinite(h.variance_ratio())) {
      return bad(absl::StrCat("variance_ratio is ", h.variance_ratio()));
    }
    if (h.has_stuck_channel() && h.stuck_channel() < 0) {
      return bad(absl::StrCat("stuck_channel is ", h.stuck_channel()));
    }
    RankHealth e;
    e.rank = h.rank();
    e.step = h.step();
    e.count = h.count();
    if (h.has_mean_shift()) e.mean_shift = h.mean_shift();
    if (h.has_variance_ratio()) e.variance_ratio = h.variance_ratio();
    if (h.has_stuck_channel()) e.stuck_channel = h.stuck_channel();
    out.push_back(e);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RelayBlock> RelayBlockFromProto(const v1::RelayBlock& proto) {
  const auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("Contribution.relay: ", what,
                     "; a relay sends the ranks it merged as ascending "
                     "(first, last) runs with one fingerprint per rank"));
  };
  if (proto.fingerprint_kind() != static_cast<int>(kFingerprintKind)) {
    return bad(absl::StrCat(
        "its fingerprints are of kind ", proto.fingerprint_kind(),
        " and this server computes kind ", static_cast<int>(kFingerprintKind),
        ": upgrade the relay and the servers together"));
  }
  const auto& runs = proto.rank_runs();
  if (runs.size() % 2 != 0 || runs.empty()) {
    return bad(absl::StrCat(runs.size(), " rank_runs values are no pairs"));
  }
  // Counted before any is listed: the fingerprints bound the list.
  int64_t count = 0;
  for (int k = 0; k < runs.size(); k += 2) {
    if (runs[k] < 0 || runs[k] > runs[k + 1] ||
        (k > 0 && runs[k] <= runs[k - 1])) {
      return bad(absl::StrCat("run ", k / 2, " (", runs[k], ", ", runs[k + 1],
                              ") is not an ascending run after the last"));
    }
    count += int64_t{runs[k + 1]} - runs[k] + 1;
    if (count > proto.fingerprints_size()) break;
  }
  if (count != proto.fingerprints_size()) {
    return bad(absl::StrCat(
        count > proto.fingerprints_size() ? "more" : "fewer",
        " ranks than its ", proto.fingerprints_size(), " fingerprints"));
  }
  RelayBlock b;
  b.first_position = proto.first_position();
  b.positions = proto.positions();
  b.ranks.reserve(count);
  for (int k = 0; k < runs.size(); k += 2) {
    for (int64_t r = runs[k]; r <= runs[k + 1]; ++r) {
      b.ranks.push_back(static_cast<int>(r));
    }
  }
  b.fingerprints.assign(proto.fingerprints().begin(),
                        proto.fingerprints().end());
  absl::Status health = RankHealthFromProto(proto, b.health);
  if (!health.ok()) return health;
  return b;
}

void RoundResultToProto(const Contribution& key, const RoundOutcome& outcome,
                        v1::RoundResult& result) {
  result.set_job_id(key.job_id);
  result.set_layer(key.layer);
  result.set_step(key.step);
  result.set_phase(static_cast<v1::Phase>(key.phase));
  result.set_backward_index(key.backward);
  if (!outcome.status.ok()) {
    RoundErrorToProto(outcome.status, outcome.missing_ranks,
                      static_cast<v1::RoundError::Reason>(outcome.reason),
                      *result.mutable_error());
    return;
  }
  result.set_version(outcome.version);
  for (int rank : outcome.missing_ranks) result.add_missing_ranks(rank);
  for (const ViewEntry& v : outcome.view) {
    v1::ViewEntry* out = result.add_view();
    out->set_rank(v.rank);
    out->set_step(v.step);
  }
  if (key.phase == Phase::kForward) {
    ToProto(outcome.moments, *result.mutable_moments());
  } else {
    ToProto(outcome.grad_sums, *result.mutable_grad_sums());
  }
}

void StatsHealthToProto(const std::string& job_id,
                        const std::optional<StatsHealthSnapshot>& health,
                        v1::StatsHealth& out) {
  out.set_job_id(job_id);
  out.set_enabled(health.has_value());
  if (!health.has_value()) return;
  for (const HealthFlag& f : health->flags) {
    v1::HealthFlag* flag = out.add_flags();
    flag->set_kind(static_cast<v1::HealthFlag::Kind>(f.kind));
    flag->set_layer(f.layer);
    flag->set_layer_name(f.layer_name);
    flag->set_group(f.group);
    flag->set_rank(f.rank);
    flag->set_channel(f.channel);
    flag->set_first_step(f.first_step);
    flag->set_last_step(f.last_step);
    flag->set_score(f.score);
    flag->set_active(f.active);
    flag->set_cleared_step(f.active ? 0 : f.cleared_step);
  }
  out.set_flags_in_force(health->flags_in_force);
  for (const auto& [rank, n] : health->refused) {
    v1::RankRefusals* r = out.add_refused();
    r->set_rank(rank);
    r->set_nonfinite(n);
  }
  out.set_nonfinite_total(health->nonfinite_total);
  out.set_rounds_scored(health->rounds_scored);
}

void LayerStatsToProto(const LayerStatsSnapshot& layer, v1::LayerStats& out) {
  out.set_layer(layer.layer);
  out.set_name(layer.name);
  out.set_group(layer.group);
  ToProto(layer.stats, out);
  out.set_frozen(layer.frozen);
}

void RunningStatsToProto(const RunningStatsSnapshot& stats,
                         v1::RunningStats& proto) {
  proto.set_job_id(stats.job_id);
  proto.set_step(stats.committed_step);
  for (const LayerStatsSnapshot& layer : stats.layers) {
    LayerStatsToProto(layer, *proto.add_layers());
  }
}

std::vector<LayerStatsSnapshot> LayerStatsFromProto(
    const v1::SetRunningStatsRequest& request) {
  std::vector<LayerStatsSnapshot> out;
  for (const v1::LayerStats& l : request.layers()) {
    LayerStatsSnapshot s;
    s.layer = l.layer();
    s.name = l.name();
    s.group = l.group();
    s.stats = FromProto(l);
    s.frozen = l.frozen();
    out.push_back(std::move(s));
  }
  return out;
}

void CheckpointToProto(const CheckpointMeta& meta, v1::CheckpointInfo& info) {
  info.set_job_id(meta.job_id);
  info.set_step(meta.step);
  info.set_tag(meta.tag);
  info.set_created_unix_ms(meta.created_unix_ms);
  if (meta.members.has_value()) {
    info.mutable_members()->Assign(meta.members->begin(), meta.members->end());
    info.set_membership_version(meta.membership_version);
  }
}

void BackupToProto(const BackupSummary& backup, v1::BackupInfo& info) {
  info.set_name(backup.name);
  info.set_shard(backup.shard);
  info.set_created_unix_ms(absl::ToUnixMillis(backup.created));
  info.set_version(backup.version);
  info.set_job_id(backup.job_id);
  for (const JobSnapshot& job : backup.jobs) {
    JobInfoToProto(job, *info.add_jobs());
  }
  info.set_path(backup.path);
  info.set_bytes(backup.bytes);
}

void RestoreToProto(const JobRestore& restore, v1::RestoreBackupJob& job) {
  job.set_job_id(restore.job_id);
  job.set_restored(restore.restored);
  job.set_committed_step(restore.committed_step);
  job.set_note(restore.note);
}

}  // namespace syncnorm
