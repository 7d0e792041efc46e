#include "client/ctl/backup_commands.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/ctl/output.h"

namespace syncnorm::ctl {
namespace {

// Copying a store takes as long as its files: these calls wait longer than
// the others unless --timeout says otherwise.
std::optional<absl::Duration> LongTimeout(const Args& args) {
  if (args.Has("timeout")) return std::nullopt;  // the client's, from it
  return absl::Minutes(10);
}

std::string JobIds(
    const google::protobuf::RepeatedPtrField<v1::JobInfo>& jobs) {
  std::vector<std::string> ids;
  for (const v1::JobInfo& j : jobs) ids.push_back(j.job_id());
  return ids.empty() ? "no jobs" : absl::StrJoin(ids, ", ");
}

}  // namespace

absl::Status BackupCommand(Client& client, const Args& args,
                           std::ostream& out) {
  if (absl::Status s = ExpectPositional(args, 0, 1, "[NAME] [--job JOB]");
      !s.ok()) {
    return s;
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  const std::string name = args.positional.empty() ? "" : args.positional[0];
  auto made = client.Backup(name, args.Get("job"), LongTimeout(args));
  if (!made.ok()) return made.status();
  if (*json) {
    v1::ListBackupsResponse response;
    for (const v1::BackupInfo& b : *made) *response.add_backups() = b;
    out << ProtoJson(response);
    return absl::OkStatus();
  }
  for (const v1::BackupInfo& b : *made) {
    out << absl::StrFormat("shard %d: %s, %s: %s\n", b.shard(), b.path(),
                           FormatBytes(b.bytes()), JobIds(b.jobs()));
  }
  out << absl::StrFormat(
      "backup '%s' written on %d shard(s); restore it with `syncnormctl "
      "restore-backup %s`\n",
      made->front().name(), made->size(), made->front().name());
  return absl::OkStatus();
}

absl::Status ListBackupsCommand(Client& client, const Args& args,
                                std::ostream& out) {
  if (absl::Status s = ExpectPositional(args, 0, 0, ""); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto backups = client.ListBackups();
  if (!backups.ok()) return backups.status();
  if (*json) {
    v1::ListBackupsResponse response;
    for (const v1::BackupInfo& b : *backups) *response.add_backups() = b;
    out << ProtoJson(response);
    return absl::OkStatus();
  }
  const int shards = static_cast<int>(client.shards().size());
  out << absl::StrFormat("%-24s %-20s %-8s %5s %10s %-9s %s\n", "NAME",
                         "CREATED (UTC)", "SHARDS", "JOBS", "SIZE", "VERSION",
                         "MISSING ON SHARDS");
  for (const v1::BackupInfo& b : *backups) {
    out << absl::StrFormat(
        "%-24s %-20s %-8s %5d %10s %-9s %s\n", b.name(),
        FormatUtc(b.created_unix_ms()),
        absl::StrCat(shards - b.missing_shards_size(), "/", shards),
        b.jobs_size(), FormatBytes(b.bytes()), b.version(),
        b.missing_shards_size() > 0 ? JoinShards(b.missing_shards()) : "-");
  }
  return absl::OkStatus();
}

absl::Status RestoreBackupCommand(Client& client, const Args& args,
                                  std::ostream& out) {
  if (absl::Status s = ExpectPositional(args, 1, 2, "NAME [JOB] [--replace]");
      !s.ok()) {
    return s;
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  const std::string& name = args.positional[0];
  const std::string job = args.positional.size() > 1 ? args.positional[1] : "";
  auto restored =
      client.RestoreBackup(name, job, args.Has("replace"), LongTimeout(args));
  if (!restored.ok()) return restored.status();
  // Each job as the shards now hold it, together.
  std::set<std::string> ids;
  for (const v1::RestoreBackupResponse& r : *restored) {
    for (const v1::RestoreBackupJob& j : r.jobs()) ids.insert(j.job_id());
  }
  std::vector<v1::JobInfo> jobs;
  for (const std::string& id : ids) {
    auto info = client.GetJob(id);
    if (!info.ok()) return info.status();
    jobs.push_back(*std::move(info));
  }
  if (*json) {
    std::vector<std::string> shards, infos;
    for (const auto& r : *restored) shards.push_back(ProtoJson(r));
    for (const auto& j : jobs) infos.push_back(ProtoJson(j));
    out << JsonObject(
        {{"shards", absl::StrCat("[", absl::StrJoin(shards, ","), "]")},
         {"jobs", absl::StrCat("[", absl::StrJoin(infos, ","), "]")}});
    return absl::OkStatus();
  }
  for (size_t shard = 0; shard < restored->size(); ++shard) {
    for (const v1::RestoreBackupJob& j : (*restored)[shard].jobs()) {
      // A job not restored says why in its note ("kept: ...", "left out:
      // ...").
      out << absl::StrFormat(
          "shard %d: %s %s\n", shard, j.job_id(),
          !j.restored() ? j.note()
          : j.note().empty()
              ? absl::StrCat("restored, at step ", j.committed_step())
              : absl::StrCat("restored, at step ", j.committed_step(), " (",
                             j.note(), ")"));
    }
  }
  for (const v1::JobInfo& j : jobs) {
    if (j.missing_shards_size() > 0) {
      out << absl::StrFormat("%s: still missing on shard(s) %s\n", j.job_id(),
                             JoinShards(j.missing_shards()));
      continue;
    }
    out << absl::StrFormat(
        "%s: committed step %d on every shard; to resume every shard from "
        "one step, `syncnormctl restore %s STEP` with a checkpoint "
        "(`syncnormctl checkpoints %s`)\n",
        j.job_id(), j.committed_step(), j.job_id(), j.job_id());
  }
  return absl::OkStatus();
}

}  // namespace syncnorm::ctl
