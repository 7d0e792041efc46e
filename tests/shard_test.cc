// A job spread over 3 aggregator shards on loopback: each shard holds the
// layers the client's rendezvous hashing gives it, and the run ends bit for
// bit where a single aggregator's run ends (outputs, every worker's mirror of
// the running statistics, the service's statistics). Then the same run with
// one shard killed (kill -9) mid-run and restarted on its data_dir and port:
// it finishes with the same result. Admin calls fan out (checkpoint on every
// shard), a contribution sent to the wrong shard is refused, and a shard that
// is down is named.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/shard_router.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"

namespace syncnorm::testing {
namespace {

constexpr char kJob[] = "shard-run";
constexpr int kShards = 3;

StackConfig Config() {
  StackConfig c;
  c.world_size = 4;
  c.group_size = 2;  // two groups, each with its own statistics
  c.global_batch = 24;
  c.channels = {8, 12, 8, 16, 8, 12};
  c.spatial = {4, 3};
  c.steps = 60;
  return c;
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(30);
  return o;
}

// The service's statistics of every group, serialized: equal strings mean
// equal bits.
std::string ServiceStats(Client& client, int groups) {
  std::string all;
  for (int g = 0; g < groups; ++g) {
    v1::GetRunningStatsRequest r;
    r.set_job_id(kJob);
    r.set_group(g);
    absl::StatusOr<v1::RunningStats> s = client.GetRunningStats(r);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return "";
    for (const v1::LayerStats& l : s->layers()) all += l.SerializeAsString();
  }
  return all;
}

bool SameOutputs(const std::vector<RankOutput>& got,
                 const std::vector<RankOutput>& want, int layers) {
  auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() &&
           (a.empty() ||
            std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
  };
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    for (int l = 0; l < layers; ++l) {
      const RankOutput& a = got[i];
      const RankOutput& b = want[i];
      if (a.rank != b.rank || !same(a.y[l], b.y[l]) ||
          !same(a.dx[l], b.dx[l]) ||
          !same(a.running[l].mean, b.running[l].mean) ||
          !same(a.running[l].var, b.running[l].var) ||
          a.running[l].num_batches_tracked !=
              b.running[l].num_batches_tracked) {
        ADD_FAILURE() << "rank " << a.rank << " layer " << l << " differs";
        return false;
      }
    }
  }
  return true;
}

std::unique_ptr<AggregatorProcess> Start(const std::string& dir, int port = 0) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> flags = {"--round_timeout_ms=20000"};
  if (port != 0) flags.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  auto a = AggregatorProcess::Start(dir, flags);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

struct Shards {
  std::vector<std::unique_ptr<AggregatorProcess>> servers;
  std::vector<std::string> dirs;
  std::string list;  // host:port,host:port,...
};

Shards StartShards(const std::string& root) {
  Shards s;
  std::vector<std::string> addresses;
  for (int i = 0; i < kShards; ++i) {
    s.dirs.push_back(absl::StrCat(root, "/shard-", i));
    s.servers.push_back(Start(s.dirs.back()));
    if (s.servers.back() == nullptr) return s;
    addresses.push_back(s.servers.back()->address());
  }
  s.list = absl::StrJoin(addresses, ",");
  return s;
}

// Every worker's and every shard's log (a restarted shard appends to its
// first life's), for a failure's message: the first failing worker's
// error alone does not say what the others and the shards saw.
std::string Logs(const Shards& s, const std::string& worker_dir, int workers) {
  std::vector<std::string> paths;
  for (int w = 0; w < workers; ++w) {
    paths.push_back(absl::StrCat(worker_dir, "/worker", w, ".log"));
  }
  for (const std::string& dir : s.dirs)
    paths.push_back(dir + "/aggregator.log");
  std::string all;
  for (const std::string& path : paths) {
    absl::StrAppend(&all, "\n==== ", path, "\n", ReadFile(path));
  }
  return all;
}

// Reference (one aggregator) and the job's placement, computed once.
class ShardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const StackConfig config = Config();
    root_ = new std::string(MakeScratchDir("shard"));
    std::unique_ptr<AggregatorProcess> single = Start(*root_ + "/single");
    ASSERT_NE(single, nullptr);
    Client client(Options(single->address()));
    ASSERT_TRUE(client.CreateJob(JobRequest(config, kJob, 20000)).ok());
    WorkersOptions w;
    w.address = single->address();
    w.job_id = kJob;
    w.dir = *root_ + "/single";
    w.timeout = absl::Minutes(2);
    const absl::Time start = absl::Now();
    auto outputs = RunWorkers(config, w);
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    reference_took_ = absl::Now() - start;
    reference_ = new std::vector<RankOutput>(*std::move(outputs));
    reference_stats_ = new std::string(ServiceStats(client, 2));
  }

  static std::string* root_;
  static std::vector<RankOutput>* reference_;
  static std::string* reference_stats_;
  static absl::Duration reference_took_;
};

std::string* ShardTest::root_ = nullptr;
std::vector<RankOutput>* ShardTest::reference_ = nullptr;
std::string* ShardTest::reference_stats_ = nullptr;
absl::Duration ShardTest::reference_took_;

TEST_F(ShardTest, LayersSpreadOverShardsGiveTheSingleServersResult) {
  ASSERT_NE(reference_, nullptr);
  const StackConfig config = Config();
  // The placement spreads this job's 6 layers over all 3 shards.
  for (int s = 0; s < kShards; ++s) {
    EXPECT_FALSE(OwnedLayers(kJob, config.layers(), s, kShards).empty())
        << "shard " << s << " holds no layer; pick another job id";
  }
  Shards shards = StartShards(*root_ + "/spread");
  ASSERT_EQ(shards.servers.size(), static_cast<size_t>(kShards));
  Client client(Options(shards.list));
  ASSERT_EQ(client.shards().size(), static_cast<size_t>(kShards));
  absl::StatusOr<v1::JobInfo> created =
      client.CreateJob(JobRequest(config, kJob, 20000));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->has_shard());
  EXPECT_EQ(created->layers_size(), config.layers());

  // Each shard was told exactly its layers.
  for (int s = 0; s < kShards; ++s) {
    Client one(Options(shards.servers[s]->address()));
    absl::StatusOr<v1::JobInfo> info = one.GetJob(kJob);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->shard().shard(), s);
    EXPECT_EQ(info->shard().num_shards(), kShards);
    const std::vector<int> want =
        OwnedLayers(kJob, config.layers(), s, kShards);
    EXPECT_EQ(std::vector<int>(info->shard().owned_layers().begin(),
                               info->shard().owned_layers().end()),
              want);
  }

  WorkersOptions w;
  w.address = shards.list;
  w.job_id = kJob;
  w.dir = *root_ + "/spread";
  w.timeout = absl::Minutes(2);
  auto got = RunWorkers(config, w);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameOutputs(*got, *reference_, config.layers()));
  EXPECT_EQ(ServiceStats(client, 2), *reference_stats_)
      << "the shards' statistics differ from the single aggregator's";

  // The job's committed step is every shard's; a checkpoint of it is cut on
  // every shard, and listed once.
  absl::StatusOr<v1::JobInfo> job = client.GetJob(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->committed_step(), config.steps - 1);
  auto checkpoint = client.Checkpoint(kJob, config.steps - 1, "end");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto listed = client.ListCheckpoints(kJob);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].tag(), "end");
  for (int s = 0; s < kShards; ++s) {
    auto on_shard =
        Client(Options(shards.servers[s]->address())).ListCheckpoints(kJob);
    ASSERT_TRUE(on_shard.ok()) << on_shard.status();
    EXPECT_EQ(on_shard->size(), 1u) << "shard " << s;
  }
  auto from_checkpoint = [&] {
    v1::GetRunningStatsRequest r;
    r.set_job_id(kJob);
    r.set_checkpoint_step(config.steps - 1);
    r.add_layers(5);
    r.add_layers(0);
    return client.GetRunningStats(r);
  }();
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status();
  ASSERT_EQ(from_checkpoint->layers_size(), 2);
  EXPECT_EQ(from_checkpoint->layers(0).layer(), 5);
  EXPECT_EQ(from_checkpoint->layers(1).layer(), 0);

  // A contribution for a layer another shard holds is refused, naming why.
  const int foreign = OwnedLayers(kJob, config.layers(), 1, kShards)[0];
  Client shard0(Options(shards.servers[0]->address()));
  Moments m;
  m.count = 2;
  m.mean.assign(config.channels[foreign], 0.5);
  m.m2.assign(config.channels[foreign], 1.0);
  auto refused =
      shard0.NewContributor(kJob, 0)->ReduceForward(foreign, config.steps, m);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("owned by another shard"),
            std::string::npos)
      << refused.status();

  // Deleting fans out too.
  EXPECT_TRUE(client.DeleteJob(kJob).ok());
  EXPECT_EQ(client.GetJob(kJob).status().code(), absl::StatusCode::kNotFound);

  // A shard that is down is named.
  const std::string down = shards.servers[2]->address();
  ASSERT_TRUE(shards.servers[2]->Stop().ok());
  ClientOptions quick = Options(shards.list);
  quick.rpc_timeout = absl::Seconds(2);
  absl::Status unreachable =
      Client(quick).CreateJob(JobRequest(config, "other", 20000)).status();
  EXPECT_EQ(unreachable.code(), absl::StatusCode::kUnavailable) << unreachable;
  EXPECT_NE(unreachable.message().find(absl::StrCat("shard 2 (", down, ")")),
            std::string::npos)
      << unreachable;
}

TEST_F(ShardTest, AShardKilledMidRunRecoversFromItsDataDir) {
  ASSERT_NE(reference_, nullptr);
  const StackConfig config = Config();
  Shards shards = StartShards(*root_ + "/killed");
  ASSERT_EQ(shards.servers.size(), static_cast<size_t>(kShards));
  Client client(Options(shards.list));
  ASSERT_TRUE(client.CreateJob(JobRequest(config, kJob, 20000)).ok());

  WorkersOptions w;
  w.address = shards.list;
  w.job_id = kJob;
  w.dir = *root_ + "/killed";
  w.timeout = absl::Minutes(2);
  absl::StatusOr<std::vector<RankOutput>> got = absl::InternalError("not run");
  absl::Notification finished;
  std::thread workers([&] {
    got = RunWorkers(config, w);
    finished.Notify();
  });
  // Kill shard 1 about a third into the run, as a crash would.
  const absl::Duration pause =
      std::max(absl::Milliseconds(200), reference_took_ / 3);
  const bool ended_early = finished.WaitForNotificationWithTimeout(pause);
  const int victim = 1;
  const int port = shards.servers[victim]->port();
  shards.servers[victim]->process().Signal(SIGKILL);
  auto code = shards.servers[victim]->process().Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGKILL);
  shards.servers[victim] = Start(shards.dirs[victim], port);
  ASSERT_NE(shards.servers[victim], nullptr);
  workers.join();
  EXPECT_FALSE(ended_early) << "the run ended before the kill; lengthen it";
  ASSERT_TRUE(got.ok()) << got.status()
                        << Logs(shards, w.dir, config.world_size);
  EXPECT_TRUE(SameOutputs(*got, *reference_, config.layers()));
  EXPECT_EQ(ServiceStats(client, 2), *reference_stats_)
      << "after the shard's restart the statistics differ";
}

}  // namespace
}  // namespace syncnorm::testing
