// A worker process of the fault and soak tests: contributes rank --rank of
// every job in --jobs, one thread (and one Reduce stream) per job, running
// forward rounds of every layer step after step with deterministic payloads
// (tests/testing/round_payload.h). Every result is checked against the
// long-double reference and appended to --log (one write per line, so a
// kill -9 leaves at most a torn last line). Runs until --stop_file exists.
//
// On start a job resumes at its committed step + 1, replaying the rounds
// its predecessor may have finished (a retry gets the stored answer). After
// a failed round it moves on to the next step, as every peer of that round
// does, so the ranks stay in step without talking to each other.
//
// --hold_step=S instead sends step S of every layer of every job at once
// and then waits to be killed (a client that vanishes with rounds open).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/contributor.h"
#include "tests/testing/round_payload.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "aggregator address");
ABSL_FLAG(std::string, jobs, "", "comma-separated job ids (created already)");
ABSL_FLAG(int, rank, 0, "this process's rank in every job");
ABSL_FLAG(int, world_size, 4, "ranks per job (one group)");
ABSL_FLAG(int, layers, 8, "layers per job");
ABSL_FLAG(int, channels, 4, "channels per layer");
ABSL_FLAG(std::string, log, "", "file the results are appended to");
ABSL_FLAG(std::string, stop_file, "", "stop once this file exists");
ABSL_FLAG(int, round_timeout_ms, 20000, "client-side bound of one round");
ABSL_FLAG(int64_t, hold_step, -1, "send this step of every layer and wait");

namespace syncnorm::testing {
namespace {

class Log {
 public:
  explicit Log(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644)) {}
  ~Log() {
    if (fd_ >= 0) ::close(fd_);
  }
  void Write(const std::string& line) {
    const std::string l = line + "\n";
    if (fd_ >= 0 && ::write(fd_, l.data(), l.size()) < 0) std::perror("log");
  }

 private:
  const int fd_;
};

bool Exists(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), F_OK) == 0;
}

// The step to resume at: after the job's committed step.
int64_t StartStep(Client& client, const std::string& job) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    absl::StatusOr<v1::JobInfo> info = client.GetJob(job);
    if (info.ok()) return info->committed_step() + 1;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return 0;
}

void RunJob(Client& client, const std::string& job, int rank, Log& log,
            const std::atomic<bool>& stop) {
  const int layers = absl::GetFlag(FLAGS_layers);
  const int channels = absl::GetFlag(FLAGS_channels);
  const absl::Duration bound =
      absl::Milliseconds(absl::GetFlag(FLAGS_round_timeout_ms)) +
      absl::Seconds(5);
  std::unique_ptr<Contributor> contributor = client.NewContributor(job, rank);
  std::vector<int64_t> last_version(layers, -1);
  std::vector<int> world;
  for (int64_t step = StartStep(client, job); !stop.load(); ++step) {
    for (int layer = 0; layer < layers; ++layer) {
      const absl::Time start = absl::Now();
      absl::StatusOr<v1::RoundResult> r = contributor->Round(
          RoundContribution(job, layer, step, rank, channels));
      const absl::Duration took = absl::Now() - start;
      const std::string key = absl::StrCat(job, " ", layer, " ", step);
      if (took > bound) {
        log.Write(
            absl::StrCat("H ", key, " ", absl::ToInt64Milliseconds(took)));
      }
      if (!r.ok()) {
        std::string msg(r.status().message());
        for (char& ch : msg) ch = ch == '\n' ? ' ' : ch;
        log.Write(absl::StrCat("F ", key, " ", r.status().raw_code(), " ",
                               absl::ToInt64Milliseconds(took), " ", msg));
        break;  // every peer of the round failed too: all move on
      }
      // The group is every rank (the soak's jobs have no groups); the ranks
      // counted are those not missing.
      std::vector<int> counted;
      const int world_size = absl::GetFlag(FLAGS_world_size);
      for (int q = 0; q < world_size; ++q) {
        bool missing = false;
        for (int m : r->missing_ranks()) missing = missing || m == q;
        if (!missing) counted.push_back(q);
      }
      const std::string bad = CheckGlobal(
          r->moments(), ReferenceMerge(job, layer, step, counted, channels));
      if (!bad.empty()) log.Write(absl::StrCat("B ", key, " ", bad));
      if (last_version[layer] >= 0 && r->version() != last_version[layer] + 1) {
        log.Write(absl::StrCat("B ", key, " version ", r->version(), " after ",
                               last_version[layer]));
      }
      last_version[layer] = r->version();
      const std::string missing = r->missing_ranks().empty()
                                      ? "-"
                                      : absl::StrJoin(r->missing_ranks(), ",");
      log.Write(absl::StrCat("O ", key, " ", r->version(), " ", missing));
    }
  }
}

void Hold(Client& client, const std::vector<std::string>& jobs, int rank) {
  const int layers = absl::GetFlag(FLAGS_layers);
  const int channels = absl::GetFlag(FLAGS_channels);
  const int64_t step = absl::GetFlag(FLAGS_hold_step);
  std::vector<std::unique_ptr<Contributor>> contributors;
  std::vector<std::thread> threads;
  for (const std::string& job : jobs) {
    contributors.push_back(client.NewContributor(job, rank));
    Contributor* c = contributors.back().get();
    for (int layer = 0; layer < layers; ++layer) {
      threads.emplace_back([c, job, layer, step, rank, channels] {
        (void)c->Round(RoundContribution(job, layer, step, rank, channels));
      });
    }
  }
  std::fprintf(stderr, "holding %zu rounds\n", threads.size());
  while (true) absl::SleepFor(absl::Seconds(1));  // until killed
}

}  // namespace
}  // namespace syncnorm::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  syncnorm::ClientOptions options;
  options.address = absl::GetFlag(FLAGS_server);
  options.rpc_timeout = absl::Seconds(5);
  options.round_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_round_timeout_ms));
  syncnorm::Client client(options);
  const std::vector<std::string> jobs =
      absl::StrSplit(absl::GetFlag(FLAGS_jobs), ',', absl::SkipEmpty());
  const int rank = absl::GetFlag(FLAGS_rank);
  if (absl::GetFlag(FLAGS_hold_step) >= 0) {
    syncnorm::testing::Hold(client, jobs, rank);
    return 0;
  }
  syncnorm::testing::Log log(absl::GetFlag(FLAGS_log));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (const std::string& job : jobs) {
    threads.emplace_back(
        [&, job] { syncnorm::testing::RunJob(client, job, rank, log, stop); });
  }
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  while (!syncnorm::testing::Exists(stop_file)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  return 0;
}
