// A shard that loses its volume, and its recovery from a backup on another
// volume, as an operator does it: two aggregator shards (real processes,
// each with a data dir and a backup dir standing for two volumes), a job
// trained by worker processes, `syncnormctl checkpoint` and `backup`; then
// shard 1 is killed and its data dir deleted, and it restarts empty.
// `syncnormctl jobs` must report the job as lost on shard 1 (not a
// committed step), `restore` must say why it cannot work, and after
// `restore-backup` and `restore JOB 19` every layer's running statistics
// must equal, bit for bit, what the service and the workers' mirrors held
// before the loss, and the float64 reference of the run; also after one
// more restart of the restored shard.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/shard_router.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster.h"
#include "tests/testing/ctl_runner.h"
#include "tests/testing/reference.h"

namespace syncnorm::testing {
namespace {

constexpr char kJob[] = "ops-job";
constexpr int kShards = 2;

StackConfig Config() {
  StackConfig c;
  c.world_size = 4;
  c.group_size = 2;
  c.global_batch = 24;
  c.channels = {8, 12, 8, 16, 8, 12};
  c.spatial = {4, 3};
  c.steps = 20;  // steps 0..19
  return c;
}

// One shard: its "volume" (data dir) and its backup volume, apart.
struct Shard {
  std::string volume;
  std::string backups;
  std::unique_ptr<AggregatorProcess> server;
  int port = 0;
};

std::unique_ptr<AggregatorProcess> StartShard(const Shard& s) {
  std::vector<std::string> flags = {"--round_timeout_ms=20000",
                                    "--backup_dir=" + s.backups};
  if (s.port != 0) flags.push_back(absl::StrCat("--listen=127.0.0.1:", s.port));
  auto a = AggregatorProcess::Start(s.volume, flags);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

// kShards shards, each with its volume and backup volume under `root`;
// their addresses, comma-separated, in `list`. Empty when one did not
// start (a test failure then).
std::vector<Shard> StartShards(const std::string& root, std::string& list) {
  std::vector<Shard> shards(kShards);
  std::vector<std::string> addresses;
  for (int i = 0; i < kShards; ++i) {
    shards[i].volume = absl::StrCat(root, "/volume-", i);
    shards[i].backups = absl::StrCat(root, "/backup-volume-", i);
    std::filesystem::create_directories(shards[i].volume);
    shards[i].server = StartShard(shards[i]);
    if (shards[i].server == nullptr) return {};
    shards[i].port = shards[i].server->port();
    addresses.push_back(shards[i].server->address());
  }
  list = absl::StrJoin(addresses, ",");
  return shards;
}

// Every group's statistics of every layer, as the service answers them.
std::vector<v1::LayerStats> ServiceStats(Client& client, int groups,
                                         int64_t checkpoint = -1) {
  std::vector<v1::LayerStats> all;
  for (int g = 0; g < groups; ++g) {
    v1::GetRunningStatsRequest r;
    r.set_job_id(kJob);
    r.set_group(g);
    if (checkpoint >= 0) {
      r.set_checkpoint_step(checkpoint);
      r.set_use_checkpoint(true);
    }
    auto s = client.GetRunningStats(r);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    all.insert(all.end(), s->layers().begin(), s->layers().end());
  }
  return all;
}

std::string Bits(const std::vector<v1::LayerStats>& stats) {
  std::string out;
  for (const v1::LayerStats& l : stats) out += l.SerializeAsString();
  return out;
}

TEST(BackupTest, AShardThatLostItsVolumeComesBackFromItsBackupBitForBit) {
  const StackConfig config = Config();
  for (int s = 0; s < kShards; ++s) {
    ASSERT_FALSE(OwnedLayers(kJob, config.layers(), s, kShards).empty())
        << "shard " << s << " holds no layer; pick another job id";
  }
  const std::string root = MakeScratchDir("backup");
  std::string list;
  std::vector<Shard> shards = StartShards(root, list);
  ASSERT_EQ(static_cast<int>(shards.size()), kShards);
  // The operator's environment names the shards once.
  const std::vector<std::string> env = {"SYNCNORM_ADDRESS=" + list};
  auto ctl = [&](std::vector<std::string> args) {
    return RunCtl(args, root, env);
  };
  ClientOptions options;
  options.address = list;
  options.rpc_timeout = absl::Seconds(30);
  Client client(options);

  // Train steps 0..19, checkpoint 19, back up.
  ASSERT_TRUE(client.CreateJob(JobRequest(config, kJob, 20000)).ok());
  WorkersOptions w;
  w.address = list;
  w.job_id = kJob;
  w.dir = root;
  w.timeout = absl::Minutes(2);
  auto outputs = RunWorkers(config, w);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  CtlResult r = ctl({"checkpoint", kJob, "19"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = ctl({"backup", "nightly"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "written on 2 shard(s)")) << r.out;
  const std::string before = Bits(ServiceStats(client, 2));
  ASSERT_EQ(Bits(ServiceStats(client, 2, 19)), before);
  // After the backup the statistics move on (an import on every shard),
  // so that only the backup and the checkpoint in it can bring them back.
  {
    v1::SetRunningStatsRequest moved;
    moved.set_job_id(kJob);
    for (int l = 0; l < config.layers(); ++l) {
      v1::LayerStats* s = moved.add_layers();
      s->set_layer(l);
      s->set_num_batches_tracked(99);
      for (int c = 0; c < config.channels[l]; ++c) {
        s->add_running_mean(0.25);
        s->add_running_var(4.0);
      }
    }
    ASSERT_TRUE(client.SetRunningStats(moved).ok());
  }

  // Shard 1 loses its volume: killed, data dir gone, started again empty.
  shards[1].server->process().Signal(SIGKILL);
  ASSERT_TRUE(shards[1].server->process().Wait(absl::Seconds(10)).ok());
  std::filesystem::remove_all(shards[1].volume + "/data");
  shards[1].server = StartShard(shards[1]);
  ASSERT_NE(shards[1].server, nullptr);

  // The loss is reported, not hidden behind a committed step.
  r = ctl({"jobs"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string line;
  for (absl::string_view l : absl::StrSplit(r.out, '\n')) {
    if (absl::StartsWith(l, kJob)) line = std::string(l);
  }
  EXPECT_TRUE(absl::StrContains(line, "LOST on shard 1")) << r.out;
  EXPECT_FALSE(absl::StrContains(line, " 19 ")) << r.out;
  r = ctl({"jobs", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json listed = nlohmann::json::parse(r.out);
  ASSERT_EQ(listed["jobs"].size(), 1u) << r.out;
  EXPECT_EQ(listed["jobs"][0]["missing_shards"], nlohmann::json({1})) << r.out;
  EXPECT_EQ(listed["jobs"][0]["committed_step"], "-1") << r.out;
  auto info = client.GetJob(kJob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(std::vector<int>(info->missing_shards().begin(),
                             info->missing_shards().end()),
            std::vector<int>{1});
  // Trainers that come back and create the job again are stopped before
  // they start shard 1 empty: the loss stays visible.
  absl::Status recreated =
      client.CreateJob(JobRequest(config, kJob, 20000)).status();
  EXPECT_EQ(recreated.code(), absl::StatusCode::kFailedPrecondition)
      << recreated;
  EXPECT_TRUE(absl::StrContains(recreated.message(), "restore-backup"))
      << recreated;
  info = client.GetJob(kJob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->missing_shards_size(), 1);
  // A restore from a checkpoint cannot work yet, and says why.
  r = ctl({"restore", kJob, "19"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "shard 1")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "lost its state")) << r.err;

  // The recovery: the backup (listed on both shards), then the checkpoint.
  r = ctl({"backups"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "nightly")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "2/2")) << r.out;
  r = ctl({"restore-backup", "nightly"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 1: ops-job restored")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 0: ops-job kept")) << r.out;
  r = ctl({"restore", kJob, "19"});
  ASSERT_EQ(r.code, 0) << r.err;
  info = client.GetJob(kJob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->missing_shards_size(), 0);
  EXPECT_EQ(info->committed_step(), 19);

  const std::vector<v1::LayerStats> restored = ServiceStats(client, 2);
  EXPECT_EQ(Bits(restored), before)
      << "the restored statistics differ from those before the loss";
  // The workers' own mirrors of the statistics at step 19, and the float64
  // reference of the run, agree with the restored service.
  const ReferenceResult reference = RunReference(config);
  for (const v1::LayerStats& l : restored) {
    const int group = l.group();
    for (const RankOutput& o : *outputs) {
      if (config.group_of(o.rank) != group) continue;
      const RunningStats& mirror = o.running[l.layer()];
      EXPECT_EQ(mirror.num_batches_tracked, l.num_batches_tracked());
      EXPECT_EQ(mirror.mean, std::vector<double>(l.running_mean().begin(),
                                                 l.running_mean().end()))
          << "rank " << o.rank << " layer " << l.layer();
      EXPECT_EQ(mirror.var, std::vector<double>(l.running_var().begin(),
                                                l.running_var().end()))
          << "rank " << o.rank << " layer " << l.layer();
    }
    const ReferenceStats& want = reference.running[group][l.layer()];
    EXPECT_EQ(l.num_batches_tracked(), want.num_batches_tracked);
    EXPECT_LE(RelativeError({l.running_mean().begin(), l.running_mean().end()},
                            want.mean),
              1e-6);
    EXPECT_LE(RelativeError({l.running_var().begin(), l.running_var().end()},
                            want.var),
              1e-6);
  }

  // What was restored is durable: another crash of shard 1 keeps it.
  shards[1].server->process().Signal(SIGKILL);
  ASSERT_TRUE(shards[1].server->process().Wait(absl::Seconds(10)).ok());
  shards[1].server = StartShard(shards[1]);
  ASSERT_NE(shards[1].server, nullptr);
  EXPECT_EQ(Bits(ServiceStats(client, 2)), before);
}

// What CreateJob refuses after a loss it still completes after a CreateJob
// that failed half way (a shard down while it ran): nothing was applied.
TEST(BackupTest, ACreateJobThatFailedHalfWayIsStillCompletedByRepeatingIt) {
  const StackConfig config = Config();
  std::string list;
  std::vector<Shard> shards = StartShards(MakeScratchDir("half"), list);
  ASSERT_EQ(static_cast<int>(shards.size()), kShards);
  ClientOptions options;
  options.address = list;
  options.rpc_timeout = absl::Seconds(2);
  Client client(options);
  ASSERT_TRUE(shards[1].server->Stop().ok());
  EXPECT_EQ(client.CreateJob(JobRequest(config, kJob, 20000)).status().code(),
            absl::StatusCode::kUnavailable);
  shards[1].server = StartShard(shards[1]);
  ASSERT_NE(shards[1].server, nullptr);
  auto info = client.GetJob(kJob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->missing_shards_size(), 1);
  auto created = client.CreateJob(JobRequest(config, kJob, 20000));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->missing_shards_size(), 0);
  EXPECT_EQ(client.GetJob(kJob)->missing_shards_size(), 0);
}

}  // namespace
}  // namespace syncnorm::testing
