#include "client/ctl/commands.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/ctl/backup_commands.h"
#include "client/ctl/membership_commands.h"
#include "client/ctl/output.h"
#include "client/ctl/state_dict.h"
#include "client/job_groups.h"
#include "client/job_membership.h"

namespace syncnorm::ctl {
namespace {

const char* ModeName(v1::MomentumMode mode) {
  switch (mode) {
    case v1::MOMENTUM_DECAY:
      return "decay";
    case v1::MOMENTUM_CUMULATIVE:
      return "cumulative";
    default:
      return "torch";
  }
}

absl::Status Need(const Args& args, size_t n, absl::string_view shape) {
  return ExpectPositional(args, n, n, shape);
}

// The statistics request of --group and --step (a checkpoint) for a job.
absl::StatusOr<v1::GetRunningStatsRequest> StatsRequest(
    const Args& args, const std::string& job) {
  v1::GetRunningStatsRequest r;
  r.set_job_id(job);
  auto group = args.Int("group");
  if (!group.ok()) return group.status();
  r.set_group(static_cast<int>(group->value_or(0)));
  auto step = args.Int("step");
  if (!step.ok()) return step.status();
  if (step->has_value()) {
    r.set_checkpoint_step(**step);
    r.set_use_checkpoint(true);
  }
  return r;
}

// The index of LAYER given as a name or an index; NOT_FOUND otherwise.
absl::StatusOr<int> FindLayer(const v1::JobInfo& job, const std::string& arg) {
  for (int i = 0; i < job.layers_size(); ++i) {
    if (job.layers(i).name() == arg) return i;
  }
  int index = -1;
  if (absl::SimpleAtoi(arg, &index) && index >= 0 &&
      index < job.layers_size()) {
    return index;
  }
  return absl::NotFoundError(
      absl::StrCat("job '", job.job_id(), "' has no layer '", arg,
                   "'; `syncnormctl layers ", job.job_id(), "` lists them"));
}

// "committed step", or which shards lost the job.
std::string JobState(const v1::JobInfo& job) {
  if (job.missing_shards_size() == 0) return "ok";
  return absl::StrCat("LOST on shard",
                      job.missing_shards_size() > 1 ? "s " : " ",
                      JoinShards(job.missing_shards()),
                      ": restore it from a backup (syncnormctl backups)");
}

// The job's latest members ("0-3,5"); "all" when the server reports none
// (an aggregator without elastic membership).
std::string Members(const v1::JobInfo& job) {
  if (!job.has_membership()) return "all";
  return FormatRanks(syncnorm::Members(job.membership()));
}

absl::Status Jobs(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 0, ""); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto jobs = client.ListJobs();
  if (!jobs.ok()) return jobs.status();
  if (*json) {
    v1::ListJobsResponse response;
    for (const v1::JobInfo& j : *jobs) *response.add_jobs() = j;
    out << ProtoJson(response);
    return absl::OkStatus();
  }
  out << absl::StrFormat("%-32s %6s %6s %6s %10s  %-16s %4s  %s\n", "JOB",
                         "WORLD", "GROUPS", "LAYERS", "COMMITTED", "MEMBERS",
                         "VER", "STATE");
  for (const v1::JobInfo& j : *jobs) {
    out << absl::StrFormat(
        "%-32s %6d %6d %6d %10s  %-16s %4d  %s\n", j.job_id(), j.world_size(),
        NumGroups(j), j.layers_size(),
        j.missing_shards_size() > 0 ? "-" : absl::StrCat(j.committed_step()),
        Members(j), j.membership().version(), JobState(j));
  }
  return absl::OkStatus();
}

absl::Status Layers(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 1, "JOB [--group=G]"); !s.ok()) return s;
  auto job = client.GetJob(args.positional[0]);
  if (!job.ok()) return job.status();
  auto request = StatsRequest(args, job->job_id());
  if (!request.ok()) return request.status();
  request->clear_checkpoint_step();
  request->clear_use_checkpoint();
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto stats = client.GetRunningStats(*request);
  if (!stats.ok()) return stats.status();
  if (*json) {
    out << JsonObject({{"job", ProtoJson(*job)}, {"stats", ProtoJson(*stats)}});
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "job %s: world %d, %d group(s), members %s (version %d), %s, committed "
      "step %d; group %d:\n",
      job->job_id(), job->world_size(), NumGroups(*job), Members(*job),
      job->membership().version(),
      job->staleness() > 0
          ? absl::StrCat("stale-synchronous (staleness ", job->staleness(), ")")
          : "synchronous",
      job->committed_step(), request->group());
  out << absl::StrFormat("%5s %-28s %8s %-10s %9s %7s %12s\n", "INDEX", "NAME",
                         "FEATURES", "MOMENTUM", "VALUE", "VAR", "BATCHES");
  for (int i = 0; i < job->layers_size(); ++i) {
    const v1::LayerSpec& l = job->layers(i);
    out << absl::StrFormat(
        "%5d %-28s %8d %-10s %9g %7s %12d\n", i, l.name(), l.num_features(),
        l.no_running_stats() ? "none" : ModeName(l.momentum_mode()),
        l.momentum(), l.biased_running_var() ? "biased" : "unbiased",
        stats->layers(i).num_batches_tracked());
  }
  return absl::OkStatus();
}

absl::Status Checkpoints(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 1, "JOB"); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto list = client.ListCheckpoints(args.positional[0]);
  if (!list.ok()) return list.status();
  if (*json) {
    v1::ListCheckpointsResponse response;
    for (const v1::CheckpointInfo& c : *list) *response.add_checkpoints() = c;
    out << ProtoJson(response);
    return absl::OkStatus();
  }
  out << absl::StrFormat("%12s  %-24s %-16s %4s  %s\n", "STEP", "CREATED (UTC)",
                         "MEMBERS", "VER", "TAG");
  for (const v1::CheckpointInfo& c : *list) {
    out << absl::StrFormat(
        "%12d  %-24s %-16s %4d  %s\n", c.step(), FormatUtc(c.created_unix_ms()),
        FormatRanks(c.members()), c.membership_version(), c.tag());
  }
  return absl::OkStatus();
}

absl::Status Stats(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 2, "JOB LAYER [--group=G] [--step=S]");
      !s.ok()) {
    return s;
  }
  auto job = client.GetJob(args.positional[0]);
  if (!job.ok()) return job.status();
  auto layer = FindLayer(*job, args.positional[1]);
  if (!layer.ok()) return layer.status();
  auto request = StatsRequest(args, job->job_id());
  if (!request.ok()) return request.status();
  request->add_layers(*layer);
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto stats = client.GetRunningStats(*request);
  if (!stats.ok()) return stats.status();
  if (*json) {
    out << ProtoJson(*stats);
    return absl::OkStatus();
  }
  const v1::LayerStats& l = stats->layers(0);
  out << absl::StrFormat(
      "job %s, layer %d '%s', group %d, %s: num_batches_tracked %d\n",
      job->job_id(), *layer, l.name(), l.group(),
      request->use_checkpoint()
          ? absl::StrCat("checkpoint of step ", stats->step())
          : absl::StrCat("latest (committed step ", stats->step(), ")"),
      l.num_batches_tracked());
  out << absl::StrFormat("%8s %24s %24s\n", "CHANNEL", "RUNNING_MEAN",
                         "RUNNING_VAR");
  for (int c = 0; c < l.running_mean_size(); ++c) {
    out << absl::StrFormat("%8d %24.17g %24.17g\n", c, l.running_mean(c),
                           l.running_var(c));
  }
  return absl::OkStatus();
}

absl::Status Export(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 1, "JOB [--group=G] [--step=S] [--out=FILE]");
      !s.ok()) {
    return s;
  }
  auto job = client.GetJob(args.positional[0]);
  if (!job.ok()) return job.status();
  auto request = StatsRequest(args, job->job_id());
  if (!request.ok()) return request.status();
  auto stats = client.GetRunningStats(*request);
  if (!stats.ok()) return stats.status();
  const std::string json = ExportStateDict(*job, *stats);
  auto file = args.options.find("out");
  if (file == args.options.end()) {
    out << json;
    return absl::OkStatus();
  }
  std::ofstream f(file->second, std::ios::trunc);
  f << json;
  f.close();
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", file->second, "'"));
  }
  return absl::OkStatus();
}

absl::Status Import(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 2, "JOB FILE [--group=G]"); !s.ok()) {
    return s;
  }
  std::ifstream f(args.positional[1]);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read '", args.positional[1], "'"));
  }
  std::stringstream text;
  text << f.rdbuf();
  auto job = client.GetJob(args.positional[0]);
  if (!job.ok()) return job.status();
  auto group = args.Int("group");
  if (!group.ok()) return group.status();
  auto request =
      ImportStateDict(*job, text.str(), static_cast<int>(group->value_or(-1)));
  if (!request.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.positional[1], ": ", request.status().message()));
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto stats = client.SetRunningStats(*request);
  if (!stats.ok()) return stats.status();
  if (*json) {
    out << ProtoJson(*stats);
    return absl::OkStatus();
  }
  out << "imported " << stats->layers_size() << " (layer, group) entries into "
      << job->job_id() << "\n";
  return absl::OkStatus();
}

// A checkpoint that ran out of time waiting for its step: says so, with
// the committed step, instead of a bare DEADLINE_EXCEEDED.
absl::Status StillWaiting(Client& client, const std::string& job, int64_t step,
                          const absl::Status& failed, const Args& args) {
  auto info = client.GetJob(job);
  if (!info.ok()) return failed;
  std::string detail(failed.message());
  detail = absl::StrContains(detail, "lagging")
               ? absl::StrCat(" (", detail.substr(detail.find("lagging")), ")")
               : "";
  return absl::DeadlineExceededError(absl::StrCat(
      "checkpoint of ", job, " at step ", step, ": still waiting for step ",
      step, " (committed ",
      info->missing_shards_size() > 0
          ? absl::StrCat("-; shards ", JoinShards(info->missing_shards()),
                         " lost the job")
          : absl::StrCat(info->committed_step()),
      ") after ", args.Get("timeout", "10s"), detail,
      ". The trainers have not reached it yet: run it again later, or give "
      "it longer with --timeout (at most 10m)"));
}

absl::Status TakeCheckpoint(Client& client, const Args& args,
                            std::ostream& out) {
  if (absl::Status s = Need(args, 2, "JOB STEP [--tag=T]"); !s.ok()) return s;
  int64_t step = 0;
  if (!absl::SimpleAtoi(args.positional[1], &step)) {
    return Usage(
        absl::StrCat("STEP '", args.positional[1], "' is not an integer"));
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto c = client.Checkpoint(args.positional[0], step, args.Get("tag"));
  if (!c.ok() && c.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return StillWaiting(client, args.positional[0], step, c.status(), args);
  }
  if (!c.ok()) return c.status();
  if (*json) {
    out << ProtoJson(*c);
    return absl::OkStatus();
  }
  out << "checkpoint of " << c->job_id() << " at step " << c->step()
      << (c->tag().empty() ? "" : absl::StrCat(" tagged ", c->tag())) << "\n";
  return absl::OkStatus();
}

absl::Status Restore(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 2, "JOB STEP"); !s.ok()) return s;
  int64_t step = 0;
  if (!absl::SimpleAtoi(args.positional[1], &step)) {
    return Usage(
        absl::StrCat("STEP '", args.positional[1], "' is not an integer"));
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto job = client.RestoreCheckpoint(args.positional[0], step);
  if (!job.ok()) return job.status();
  if (*json) {
    out << ProtoJson(*job);
    return absl::OkStatus();
  }
  out << "restored " << job->job_id() << " to step " << job->committed_step()
      << "; training resumes with step " << job->committed_step() + 1 << "\n";
  return absl::OkStatus();
}

// HealthFlag.Kind as the metrics and log lines name it.
std::string KindName(v1::HealthFlag::Kind kind) {
  std::string name = v1::HealthFlag::Kind_Name(kind);
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

absl::Status Health(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 1, "JOB"); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto health = client.GetStatsHealth(args.positional[0]);
  if (!health.ok()) return health.status();
  if (*json) {
    out << ProtoJson(*health);
    return absl::OkStatus();
  }
  if (!health->enabled()) {
    out << "job " << health->job_id()
        << ": statistics health is off (CreateJobRequest."
           "disable_stats_health)\n";
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "job %s: %d flag(s) in force, %d forward round(s) scored, %d "
      "contribution(s) refused as non-finite\n",
      health->job_id(), health->flags_in_force(), health->rounds_scored(),
      health->nonfinite_total());
  if (health->missing_shards_size() > 0) {
    out << "shards without the job: "
        << absl::StrJoin(health->missing_shards(), ",") << "\n";
  }
  if (health->flags_size() > 0) {
    out << absl::StrFormat("%-8s %-15s %5s %-24s %5s %5s %7s %10s %10s %8s\n",
                           "STATE", "KIND", "LAYER", "NAME", "GROUP", "RANK",
                           "CHANNEL", "FIRST", "LAST", "SCORE");
  }
  for (const v1::HealthFlag& f : health->flags()) {
    out << absl::StrFormat(
        "%-8s %-15s %5d %-24s %5d %5s %7s %10d %10s %8.3g\n",
        f.active() ? "flagged" : "cleared", KindName(f.kind()), f.layer(),
        f.layer_name(), f.group(), f.rank() < 0 ? "-" : absl::StrCat(f.rank()),
        f.channel() < 0 ? "-" : absl::StrCat(f.channel()), f.first_step(),
        f.active() ? absl::StrCat(f.last_step())
                   : absl::StrCat(f.cleared_step(), " (clr)"),
        f.score());
  }
  if (health->flags_in_force() >
      std::count_if(health->flags().begin(), health->flags().end(),
                    [](const v1::HealthFlag& f) { return f.active(); })) {
    out << "(more flags in force than listed)\n";
  }
  for (const v1::RankRefusals& r : health->refused()) {
    out << absl::StrFormat(
        "rank %d: %d contribution(s) refused as non-finite\n", r.rank(),
        r.nonfinite());
  }
  return absl::OkStatus();
}

absl::Status Delete(Client& client, const Args& args, std::ostream& out) {
  if (absl::Status s = Need(args, 1, "JOB"); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  if (absl::Status s = client.DeleteJob(args.positional[0]); !s.ok()) return s;
  if (*json) {
    v1::DeleteJobRequest deleted;
    deleted.set_job_id(args.positional[0]);
    out << ProtoJson(deleted);
    return absl::OkStatus();
  }
  out << "deleted " << args.positional[0] << "\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status Run(Client& client, const Args& args, std::ostream& out) {
  using Command =
      std::function<absl::Status(Client&, const Args&, std::ostream&)>;
  static const auto* commands = new std::map<std::string, Command>{
      {"jobs", Jobs},
      {"layers", Layers},
      {"checkpoints", Checkpoints},
      {"stats", Stats},
      {"export", Export},
      {"import", Import},
      {"checkpoint", TakeCheckpoint},
      {"restore", Restore},
      {"delete", Delete},
      {"health", Health},
      {"backup", BackupCommand},
      {"backups", ListBackupsCommand},
      {"restore-backup", RestoreBackupCommand},
      {"members", MembersCommand},
      {"join", ChangeMembersCommand},
      {"leave", ChangeMembersCommand},
      {"remove", ChangeMembersCommand},
  };
  auto it = commands->find(args.command);
  if (it == commands->end()) {
    return Usage(args.command.empty()
                     ? "no command given"
                     : absl::StrCat("unknown command '", args.command, "'"));
  }
  return it->second(client, args, out);
}

std::string UsageText() {
  return R"(usage: syncnormctl [--server ADDRESS] [--timeout DURATION] [-o table|json] COMMAND ...

Commands:
  jobs                                   list the jobs: committed step, members and
                                         their version, or the shards that lost one
  layers JOB [--group G]                 a job's layers with their num_batches_tracked
  checkpoints JOB                        a job's checkpoints (step, time, members, tag)
  stats JOB LAYER [--group G] [--step S] a layer's running statistics as a table
                                         (LAYER: name or index; --step: a checkpoint)
  export JOB [--group G] [--step S] [--out FILE]
                                         running statistics as JSON keyed like a torch
                                         state_dict (<layer>.running_mean, .running_var,
                                         .num_batches_tracked); stdout unless --out
  import JOB FILE [--group G]            seed a job's statistics from such a file (every
                                         group unless --group)
  checkpoint JOB STEP [--tag T]          wait for STEP and checkpoint it
  restore JOB STEP                       roll the job back to its checkpoint at STEP
  delete JOB                             delete a job and all of its state
  health JOB                             statistics health: ranks whose statistics
                                         disagree with their group's (mean shift,
                                         variance ratio, stuck channel), dead channels,
                                         non-finite contributions per rank
  members JOB                            an elastic job's members, version, next step
                                         and the changes it keeps
  join JOB RANK... [--step N]            RANKs contribute from step N (default: the
                                         job's next step); each starts from the
                                         service's running statistics
  leave JOB RANK... [--step N]           RANKs stop gracefully: in every round before
                                         step N, none from it
  remove JOB RANK... [--step N]          RANKs are gone: as leave, and rounds before N
                                         still waiting for them complete without them
  backup [NAME] [--job JOB]              write backup NAME (default: the UTC time) of every
                                         job, or of JOB, on every shard, each in its
                                         --backup_dir (waits up to --timeout, default 10m)
  backups                                list the backups (shards that have each, jobs, size)
  restore-backup NAME [JOB] [--replace]  load a backup's jobs (or JOB) into every shard
                                         from its copy; a job a shard still holds is kept
                                         unless --replace (default --timeout 10m)
  help                                   this text

Options (each as --name VALUE or --name=VALUE):
  --server     the aggregator, or its shards HOST:PORT,HOST:PORT,... in ordinal
               order; default $SYNCNORM_ADDRESS, else 127.0.0.1:50051
  --timeout    per call, default 10s (backup, restore-backup: 10m)
  -o, --output table (default) or json: protobuf's JSON of the answer (field names
               as in the proto, 64-bit integers as strings); export is JSON anyway
  -h, --help   this text;  --version  syncnormctl's version
TLS: --tls (the system's roots), --tls_ca FILE (the CA of the server's
certificate; implies --tls), --tls_cert FILE --tls_key FILE (this client's
certificate, for mutual TLS). --token_file FILE: a bearer token (admin, or
scoped to the job; backups need admin) read from FILE, so that it is not on
the command line.
Exit codes: 0 ok, 1 other error, 2 usage, 3 server unreachable, or a call out
of --timeout (a checkpoint still waiting for its step), 4 not found, 5 invalid
input or request refused (bad file, wrong shape, ...).
)";
}

}  // namespace syncnorm::ctl
