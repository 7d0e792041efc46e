// kill -9 of the aggregator at random moments of a multi-worker run: the
// server restarts on the same data_dir and port, the workers' retries
// recreate the rounds in flight, and the run must end bit for bit where an
// uninterrupted run ends (outputs of the last step, every worker's mirror of
// the running statistics, and the aggregator's statistics of every group).
#include <signal.h>
#include <sys/stat.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"

namespace syncnorm::testing {
namespace {

StackConfig Config() {
  StackConfig c;
  c.world_size = 4;
  c.group_size = 2;  // two groups: each keeps its own statistics
  c.global_batch = 24;
  c.channels = {8, 8, 12};
  c.spatial = {4, 3};
  c.steps = 120;
  return c;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(30);
  return o;
}

// The aggregator's statistics of every group, serialized: equal strings
// mean equal bits.
std::string ServerStats(const std::string& address, const std::string& job,
                        int groups) {
  Client client(Options(address));
  std::string all;
  for (int g = 0; g < groups; ++g) {
    v1::GetRunningStatsRequest r;
    r.set_job_id(job);
    r.set_group(g);
    absl::StatusOr<v1::RunningStats> s = client.GetRunningStats(r);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return "";
    for (v1::LayerStats& l : *s->mutable_layers()) {
      all += absl::StrCat(l.num_batches_tracked(), ":");
      l.clear_name();
      all += l.SerializeAsString();
    }
  }
  return all;
}

// Starts the aggregator of `dir`, on `port` if given.
std::unique_ptr<AggregatorProcess> Start(const std::string& dir, int port = 0) {
  std::vector<std::string> flags = {"--round_timeout_ms=20000"};
  if (port != 0) flags.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  auto a = AggregatorProcess::Start(dir, flags);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

TEST(CrashTest, KillNineAtRandomMomentsChangesNothing) {
  const StackConfig config = Config();
  const std::string root = MakeScratchDir("crash");

  // The uninterrupted reference run.
  const std::string ref_dir = root + "/reference";
  ASSERT_EQ(::mkdir(ref_dir.c_str(), 0755), 0);
  std::unique_ptr<AggregatorProcess> ref = Start(ref_dir);
  ASSERT_NE(ref, nullptr);
  ASSERT_TRUE(Client(Options(ref->address()))
                  .CreateJob(JobRequest(config, "run", 20000))
                  .ok());
  WorkersOptions w;
  w.address = ref->address();
  w.job_id = "run";
  w.dir = ref_dir;
  w.timeout = absl::Minutes(2);
  const absl::Time ref_start = absl::Now();
  auto expected = RunWorkers(config, w);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const absl::Duration ref_took = absl::Now() - ref_start;
  const std::string expected_stats = ServerStats(ref->address(), "run", 2);
  ref.reset();

  // The same run while the aggregator is killed and restarted.
  const std::string dir = root + "/crashing";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::unique_ptr<AggregatorProcess> agg = Start(dir);
  ASSERT_NE(agg, nullptr);
  const std::string address = agg->address();
  ASSERT_TRUE(Client(Options(address))
                  .CreateJob(JobRequest(config, "run", 20000))
                  .ok());
  w.address = address;
  w.dir = dir;
  absl::StatusOr<std::vector<RankOutput>> got = absl::InternalError("not run");
  absl::Notification finished;
  std::thread workers([&] {
    got = RunWorkers(config, w);
    finished.Notify();
  });
  const uint64_t seed = std::random_device()();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pause_ms(
      50, std::max<int>(200, absl::ToInt64Milliseconds(ref_took) / 6));
  int kills = 0;
  while (kills < 4 && !finished.WaitForNotificationWithTimeout(
                          absl::Milliseconds(pause_ms(rng)))) {
    agg->process().Signal(SIGKILL);
    auto code = agg->process().Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 128 + SIGKILL);
    ++kills;
    agg = Start(dir, agg->port());
    ASSERT_NE(agg, nullptr) << "restart " << kills;
  }
  workers.join();
  std::fprintf(
      stderr, "seed %llu: %d kills; reference run %s, interrupted run %s\n",
      static_cast<unsigned long long>(seed), kills,
      absl::FormatDuration(ref_took).c_str(),
      absl::FormatDuration(absl::Now() - ref_start - ref_took).c_str());
  ASSERT_TRUE(got.ok()) << got.status() << " (seed " << seed << ")";
  EXPECT_GE(kills, 3) << "the run ended before three kills; lengthen it";

  ASSERT_EQ(got->size(), expected->size());
  for (size_t i = 0; i < got->size(); ++i) {
    const RankOutput& a = (*got)[i];
    const RankOutput& b = (*expected)[i];
    ASSERT_EQ(a.rank, b.rank);
    for (int l = 0; l < config.layers(); ++l) {
      EXPECT_TRUE(SameBits(a.running[l].mean, b.running[l].mean) &&
                  SameBits(a.running[l].var, b.running[l].var) &&
                  a.running[l].num_batches_tracked ==
                      b.running[l].num_batches_tracked)
          << "rank " << a.rank << " layer " << l << " running stats";
      EXPECT_TRUE(SameBits(a.y[l], b.y[l]) && SameBits(a.dx[l], b.dx[l]))
          << "rank " << a.rank << " layer " << l << " outputs";
    }
  }
  EXPECT_EQ(ServerStats(address, "run", 2), expected_stats)
      << "the aggregator's statistics differ from the uninterrupted run's";

  // And once more from a cold start on the same data_dir.
  agg->process().Signal(SIGKILL);
  ASSERT_TRUE(agg->process().Wait(absl::Seconds(10)).ok());
  agg = Start(dir, agg->port());
  ASSERT_NE(agg, nullptr);
  EXPECT_EQ(ServerStats(address, "run", 2), expected_stats);
}

}  // namespace
}  // namespace syncnorm::testing
