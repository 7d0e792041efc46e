#include "client/ctl/membership_commands.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/output.h"
#include "client/job_membership.h"

namespace syncnorm::ctl {
namespace {

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// "joined 3; left 1" of a change ("as created" for the first version).
std::string WhatChanged(const v1::MembershipChange& c) {
  std::vector<std::string> parts;
  if (const RankSet joined = Joined(c); !joined.empty()) {
    parts.push_back(absl::StrCat("joined ", FormatRanks(joined)));
  }
  if (const RankSet left = Left(c); !left.empty()) {
    parts.push_back(absl::StrCat("left ", FormatRanks(left)));
  }
  if (const RankSet removed = Removed(c); !removed.empty()) {
    parts.push_back(absl::StrCat("removed ", FormatRanks(removed)));
  }
  if (c.restored()) {
    // A restore puts the checkpoint's members back from its step + 1.
    parts.push_back(
        absl::StrCat("restored from the checkpoint of step ", c.step() - 1));
  }
  if (parts.empty()) return "as created";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i)
    absl::StrAppend(&out, "; ", parts[i]);
  return out;
}

}  // namespace

absl::Status MembersCommand(Client& client, const Args& args,
                            std::ostream& out) {
  if (absl::Status s = ExpectPositional(args, 1, 1, "JOB"); !s.ok()) return s;
  auto json = args.Json();
  if (!json.ok()) return json.status();
  auto job = client.GetJob(args.positional[0]);
  if (!job.ok()) return job.status();
  const v1::Membership& m = job->membership();
  if (*json) {
    out << JsonObject({{"job_id", Quoted(job->job_id())},
                       {"world_size", absl::StrCat(job->world_size())},
                       {"next_step", Quoted(absl::StrCat(job->next_step()))},
                       {"membership", ProtoJson(m)}});
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "job %s: members %s of world %d (version %d); next step %d\n",
      job->job_id(), FormatRanks(Members(m)), job->world_size(), m.version(),
      job->next_step());
  out << absl::StrFormat("%7s %10s  %-24s %s\n", "VERSION", "FROM STEP",
                         "MEMBERS", "CHANGE");
  for (const v1::MembershipChange& c : m.history()) {
    out << absl::StrFormat("%7d %10d  %-24s %s\n", c.version(), c.step(),
                           FormatRanks(Members(c)), WhatChanged(c));
  }
  return absl::OkStatus();
}

absl::Status ChangeMembersCommand(Client& client, const Args& args,
                                  std::ostream& out) {
  const std::string& verb = args.command;
  if (absl::Status s =
          ExpectPositional(args, 2, SIZE_MAX, "JOB RANK... [--step N]");
      !s.ok()) {
    return s;
  }
  auto ranks = ParseRanks(args, 1);
  if (!ranks.ok()) return ranks.status();
  auto step = args.Int("step");
  if (!step.ok()) return step.status();
  if (step->value_or(0) < 0) {
    return Usage(absl::StrCat("--step=", **step,
                              ": a step is >= 0 (0 or none: the job's next "
                              "step)"));
  }
  auto json = args.Json();
  if (!json.ok()) return json.status();
  v1::UpdateMembershipRequest request;
  request.set_job_id(args.positional[0]);
  request.set_step(step->value_or(0));
  for (int rank : *ranks) {
    if (verb == "join") request.add_join(rank);
    if (verb == "leave") request.add_leave(rank);
    if (verb == "remove") request.add_remove(rank);
  }
  auto job = client.UpdateMembership(request);
  if (!job.ok()) return job.status();
  if (*json) {
    out << ProtoJson(*job);
    return absl::OkStatus();
  }
  const v1::Membership& m = job->membership();
  const int64_t from =
      m.history_size() > 0 ? m.history(m.history_size() - 1).step() : 0;
  out << absl::StrFormat(
      "job %s: from step %d the members are %s (version %d)\n", job->job_id(),
      from, FormatRanks(Members(m)), m.version());
  return absl::OkStatus();
}

}  // namespace syncnorm::ctl
