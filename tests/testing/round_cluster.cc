#include "tests/testing/round_cluster.h"

#include <dirent.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/client.h"

namespace syncnorm::testing {
namespace {

ClientOptions Options(const std::string& server) {
  ClientOptions o;
  o.address = server;
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

bool Near(double got, long double want, long double tol) {
  return std::fabs(static_cast<long double>(got) - want) <=
         tol * std::max<long double>(1, std::fabs(want));
}

}  // namespace

RoundCluster::RoundCluster(RoundClusterOptions options)
    : options_(std::move(options)), workers_(options_.world_size) {}

RoundCluster::~RoundCluster() = default;  // Subprocess kills what is left

absl::Status RoundCluster::CreateJobs(const std::string& server) const {
  Client client(Options(server));
  for (const std::string& job : options_.jobs) {
    v1::CreateJobRequest r;
    r.set_job_id(job);
    r.set_world_size(options_.world_size);
    r.set_round_timeout_ms(options_.round_timeout_ms);
    for (int l = 0; l < options_.layers; ++l) {
      v1::LayerSpec* spec = r.add_layers();
      spec->set_name(absl::StrCat("bn", l));
      spec->set_num_features(options_.channels);
    }
    absl::StatusOr<v1::JobInfo> info = client.CreateJob(r);
    if (!info.ok()) return info.status();
  }
  return absl::OkStatus();
}

std::string RoundCluster::LogPath(int rank) const {
  return absl::StrCat(options_.dir, "/rank", rank, ".log");
}

std::vector<std::string> RoundCluster::LogPaths() const {
  std::vector<std::string> out;
  for (int r = 0; r < options_.world_size; ++r) out.push_back(LogPath(r));
  return out;
}

absl::Status RoundCluster::StartWorker(int rank) {
  workers_[rank].reset();  // kills and reaps a predecessor
  auto p = Subprocess::Spawn(
      {Runfile("tests/round-worker"),
       absl::StrCat("--server=", options_.address),
       absl::StrCat("--jobs=", absl::StrJoin(options_.jobs, ",")),
       absl::StrCat("--rank=", rank),
       absl::StrCat("--world_size=", options_.world_size),
       absl::StrCat("--layers=", options_.layers),
       absl::StrCat("--channels=", options_.channels),
       absl::StrCat("--log=", LogPath(rank)),
       absl::StrCat("--stop_file=", options_.dir, "/stop"),
       absl::StrCat("--round_timeout_ms=",
                    std::max<int64_t>(20000, 4 * options_.round_timeout_ms))},
      absl::StrCat(options_.dir, "/rank", rank, ".stderr"));
  if (!p.ok()) return p.status();
  workers_[rank] = *std::move(p);
  return absl::OkStatus();
}

absl::Status RoundCluster::StartAll() {
  for (int r = 0; r < options_.world_size; ++r) {
    if (absl::Status s = StartWorker(r); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void RoundCluster::KillWorker(int rank) {
  if (workers_[rank] == nullptr) return;
  workers_[rank]->Signal(SIGKILL);
  (void)workers_[rank]->Wait(absl::Seconds(10));
  workers_[rank].reset();
}

absl::Status RoundCluster::StopAll(absl::Duration timeout) {
  std::ofstream(absl::StrCat(options_.dir, "/stop")) << "stop\n";
  const absl::Time deadline = absl::Now() + timeout;
  for (int r = 0; r < options_.world_size; ++r) {
    if (workers_[r] == nullptr) continue;
    absl::StatusOr<int> code =
        workers_[r]->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
    if (!code.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "worker ", r, " did not stop: ", code.status().message()));
    }
    if (*code != 0) {
      return absl::InternalError(absl::StrCat("worker ", r, " exited with ",
                                              *code, "; see ", options_.dir));
    }
    workers_[r].reset();
  }
  return absl::OkStatus();
}

int RoundCluster::CompletedRounds(int rank) const {
  int n = 0;
  for (const RoundLogEntry& e : ReadRoundLogs({LogPath(rank)})) {
    n += e.kind == 'O';
  }
  return n;
}

absl::Status RoundCluster::Check(const std::string& server,
                                 int min_rounds_per_job) const {
  const std::vector<RoundLogEntry> entries = ReadRoundLogs(LogPaths());
  for (const RoundLogEntry& e : entries) {
    if (e.kind == 'B') return absl::InternalError(e.text);
    if (e.kind == 'H') {
      return absl::DeadlineExceededError(
          absl::StrCat("a round of job ", e.job, " layer ", e.layer, " step ",
                       e.step, " took ", e.elapsed_ms, " ms (a hang)"));
    }
  }
  absl::StatusOr<std::map<std::string, JobRounds>> jobs =
      CollectRounds(entries);
  if (!jobs.ok()) return jobs.status();
  Client client(Options(server));
  for (const std::string& job : options_.jobs) {
    const JobRounds& rounds = (*jobs)[job];
    v1::GetRunningStatsRequest req;
    req.set_job_id(job);
    absl::StatusOr<v1::RunningStats> stats = client.GetRunningStats(req);
    if (!stats.ok()) return stats.status();
    int total = 0;
    for (const v1::LayerStats& l : stats->layers()) {
      auto it = rounds.completed.find(l.layer());
      const std::map<int64_t, int64_t> none;
      const auto& steps = it == rounds.completed.end() ? none : it->second;
      total += steps.size();
      const ReferenceRunning want = ReplayRunning(
          job, l.layer(), steps, options_.world_size, options_.channels);
      if (l.num_batches_tracked() != want.num_batches_tracked) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job, " layer ", l.layer(), ": the server tracked ",
            l.num_batches_tracked(), " batches, the workers saw ",
            want.num_batches_tracked, " rounds complete"));
      }
      for (int c = 0; c < options_.channels; ++c) {
        if (!Near(l.running_mean(c), want.mean[c], 1e-9L) ||
            !Near(l.running_var(c), want.var[c], 1e-9L)) {
          return absl::FailedPreconditionError(
              absl::StrCat("job ", job, " layer ", l.layer(), " channel ", c,
                           ": running mean/var ", l.running_mean(c), "/",
                           l.running_var(c), " differ from the reference ",
                           (double)want.mean[c], "/", (double)want.var[c]));
        }
      }
    }
    if (total < min_rounds_per_job) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job, " completed only ", total, " rounds"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcStats> ReadProcStats(pid_t pid) {
  ProcStats s;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  if (!status) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      (void)absl::SimpleAtoi(
          absl::StripSuffix(absl::StripAsciiWhitespace(v), " kB"), &s.rss_kb);
    } else if (absl::ConsumePrefix(&v, "Threads:")) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &s.threads);
    }
  }
  if (DIR* d = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (dirent* e = ::readdir(d)) s.fds += e->d_name[0] != '.';
    ::closedir(d);
  }
  return s;
}

int64_t RssKbOnceAtMost(pid_t pid, int64_t kb, absl::Duration timeout) {
  auto rss_kb = [pid]() -> int64_t {
    absl::StatusOr<ProcStats> s = ReadProcStats(pid);
    return s.ok() ? s->rss_kb : -1;
  };
  const absl::Time deadline = absl::Now() + timeout;
  int64_t rss = rss_kb();
  while (rss > kb && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    rss = rss_kb();
  }
  return rss;
}

}  // namespace syncnorm::testing
