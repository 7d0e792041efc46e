// Soak: 32 jobs x 4 workers x 8 layers running rounds concurrently while
// worker processes are killed -9 and restarted, every connection is cut
// (streams dropped mid-round), and the server is killed -9 and restarted on
// the same data_dir and port. Every completed round must equal the
// long-double reference merge of the contributions it counted, no update
// may be counted twice or lost, nothing may hang, and the server's memory
// must be flat at the end.
//
// --soak_seconds (default 90; the CI bound) runs it longer, e.g.
//   bazel test --config=slow //tests:soak_test --test_arg=--soak_seconds=1800
//       --test_timeout=3600
// (it is tagged "slow": without --config=slow, no test runs).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "tests/testing/health.h"
#include "tests/testing/round_cluster.h"
#include "tests/testing/tcp_proxy.h"

ABSL_FLAG(int, soak_seconds, 90, "how long the soak runs");
ABSL_FLAG(uint64_t, soak_seed, 0, "chaos seed; 0: random");

namespace syncnorm::testing {
namespace {

constexpr int kJobs = 32;
constexpr int kWorkers = 4;
constexpr int kLayers = 8;
constexpr int64_t kRoundTimeoutMs = 2000;

std::unique_ptr<AggregatorProcess> StartAggregator(const std::string& dir,
                                                   int port = 0) {
  std::vector<std::string> flags;
  if (port != 0) flags.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  auto a = AggregatorProcess::Start(dir, flags);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

int64_t RssKb(AggregatorProcess& agg) {
  auto s = ReadProcStats(agg.process().pid());
  return s.ok() ? s->rss_kb : -1;
}

TEST(SoakTest, ChaosChangesNoResult) {
  const absl::Duration total = absl::Seconds(absl::GetFlag(FLAGS_soak_seconds));
  uint64_t seed = absl::GetFlag(FLAGS_soak_seed);
  if (seed == 0) seed = std::random_device()();
  std::mt19937_64 rng(seed);
  std::fprintf(stderr, "soak: %s, seed %llu\n",
               absl::FormatDuration(total).c_str(),
               static_cast<unsigned long long>(seed));

  const std::string dir = MakeScratchDir("soak");
  std::unique_ptr<AggregatorProcess> agg = StartAggregator(dir);
  ASSERT_NE(agg, nullptr);
  const int port = agg->port();
  auto proxy = TcpProxy::Start(port);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  RoundClusterOptions o;
  o.address = absl::StrCat("127.0.0.1:", (*proxy)->port());
  o.dir = dir;
  for (int j = 0; j < kJobs; ++j) o.jobs.push_back(absl::StrCat("soak-", j));
  o.world_size = kWorkers;
  o.layers = kLayers;
  o.round_timeout_ms = kRoundTimeoutMs;
  RoundCluster cluster(o);
  ASSERT_TRUE(cluster.CreateJobs(agg->address()).ok());
  ASSERT_TRUE(cluster.StartAll().ok());

  // Phase 1 (60%): every kind of fault, the server restarts included.
  // Phase 2 (40%): worker kills and dropped streams on one server process,
  // whose memory is sampled after a warm-up and at the end.
  const absl::Time start = absl::Now();
  const absl::Time phase2 = start + total * 0.6;
  const absl::Time end = start + total;
  int server_kills = 0, worker_kills = 0, drops = 0;
  int64_t rss_warm = -1;
  absl::Time warm_at = absl::InfiniteFuture();
  std::uniform_int_distribution<int> pause_ms(1500, 3500);
  std::uniform_int_distribution<int> pick(0, 9);
  auto channel =
      grpc::CreateChannel(agg->address(), grpc::InsecureChannelCredentials());
  int unhealthy = 0;
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(pause_ms(rng)));
    const bool in_phase2 = absl::Now() >= phase2;
    if (in_phase2 && warm_at == absl::InfiniteFuture()) {
      // Phase 1 had at least two server kills, whatever the dice said.
      while (server_kills < 2) {
        agg->process().Signal(SIGKILL);
        ASSERT_TRUE(agg->process().Wait(absl::Seconds(10)).ok());
        ++server_kills;
        agg = StartAggregator(dir, port);
        ASSERT_NE(agg, nullptr);
        absl::SleepFor(absl::Seconds(1));
      }
      warm_at = absl::Now() + absl::Seconds(5);
    }
    if (rss_warm < 0 && absl::Now() >= warm_at) rss_warm = RssKb(*agg);
    const int event = pick(rng);
    if (event < 4) {
      const int rank = static_cast<int>(rng() % kWorkers);
      cluster.KillWorker(rank);
      ++worker_kills;
      absl::SleepFor(absl::Milliseconds(200));
      ASSERT_TRUE(cluster.StartWorker(rank).ok());
    } else if (event < 8 || in_phase2) {
      drops += (*proxy)->DropAll();
    } else {
      agg->process().Signal(SIGKILL);
      ASSERT_TRUE(agg->process().Wait(absl::Seconds(10)).ok());
      ++server_kills;
      agg = StartAggregator(dir, port);
      ASSERT_NE(agg, nullptr);
    }
    // The server answers health checks throughout (bounded).
    auto health = CheckHealth(channel);
    unhealthy += !health.ok() || *health != 1;
  }
  ASSERT_TRUE(
      cluster
          .StopAll(absl::Milliseconds(kRoundTimeoutMs) * 4 + absl::Seconds(20))
          .ok())
      << "a worker hung";
  absl::SleepFor(absl::Milliseconds(2 * kRoundTimeoutMs));  // rounds expire
  const int64_t rss_end = RssKb(*agg);
  int completed = 0;
  for (int r = 0; r < kWorkers; ++r) completed += cluster.CompletedRounds(r);
  std::fprintf(stderr,
               "soak: %d rounds completed (rank logs), %d worker kills, %d "
               "connections cut, %d server kills, %d failed health checks; "
               "server rss %lld kB after warm-up, %lld kB at the end\n",
               completed, worker_kills, drops, server_kills, unhealthy,
               static_cast<long long>(rss_warm),
               static_cast<long long>(rss_end));
  absl::Status checked =
      cluster.Check(agg->address(), /*min_rounds_per_job=*/8);
  EXPECT_TRUE(checked.ok()) << checked << " (seed " << seed << ")";
  if (rss_warm > 0) {
    EXPECT_LE(rss_end, rss_warm * 13 / 10 + 30 * 1024)
        << "server memory grew from " << rss_warm << " kB to " << rss_end;
  }
}

}  // namespace
}  // namespace syncnorm::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
