// The aggregator binary's state across restarts: the same jobs, statistics
// and checkpoints after a stop; checkpoint at S, go on, restore S (through
// the SyncBatchNorm layer); and startup on a corrupt, truncated or
// unwritable data_dir: a clear error and exit code 1, never a crash; and a
// client whose calls keep going while the server is killed and restarted.
#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/layer_spec.h"
#include "client/node_group.h"
#include "client/running_stats.h"
#include "client/solo_node_group.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(10);
  o.round_timeout = absl::Seconds(10);
  return o;
}

// One layer of 3 channels trained by one worker.
class Trainer {
 public:
  explicit Trainer(Client& client, const std::string& job) : client_(client) {
    options_.num_features = 3;
    v1::CreateJobRequest r;
    r.set_job_id(job);
    r.set_world_size(1);
    *r.add_layers() = *ToLayerSpec(options_, "bn");
    EXPECT_TRUE(client.CreateJob(r).ok());
    group_ = std::make_unique<SoloNodeGroup>(client.NewContributor(job, 0));
    layer_ =
        std::make_unique<SyncBatchNorm>(0, options_, group_.get(), nullptr);
  }

  // One training forward on the data of `step` (a pure function of it).
  void Step(int64_t step) {
    std::mt19937 rng(static_cast<uint32_t>(step));
    std::normal_distribution<float> value(1.0f * step, 2.0f);
    std::vector<float> x(4 * 3 * 5), y(x.size());
    for (float& v : x) v = value(rng);
    ASSERT_TRUE(
        layer_->Forward({x.data(), {4, 3, 5}}, {y.data(), {4, 3, 5}}).ok());
  }

  SyncBatchNorm& layer() { return *layer_; }

 private:
  Client& client_;
  SyncBatchNormOptions options_;
  std::unique_ptr<NodeGroup> group_;
  std::unique_ptr<SyncBatchNorm> layer_;
};

bool SameBits(const RunningStats& a, const RunningStats& b) {
  return a.num_batches_tracked == b.num_batches_tracked && a.mean == b.mean &&
         a.var == b.var;
}

TEST(StateTest, CheckpointGoOnRestoreAndResumeThroughTheLayer) {
  const std::string dir = MakeScratchDir("restore");
  auto agg = AggregatorProcess::Start(dir);
  ASSERT_TRUE(agg.ok()) << agg.status();
  Client client(Options((*agg)->address()));
  Trainer t(client, "resume");
  for (int64_t s = 0; s <= 2; ++s) t.Step(s);
  const RunningStats at2 = t.layer().running_stats();
  auto c = client.Checkpoint("resume", 2, "epoch-end");
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t s = 3; s <= 5; ++s) t.Step(s);
  const RunningStats at5 = t.layer().running_stats();
  // The server restarts (gracefully) in between: the checkpoint survives.
  ASSERT_EQ(*(*agg)->Stop(), 0);
  agg = AggregatorProcess::Start(dir);
  ASSERT_TRUE(agg.ok()) << agg.status();
  Client again(Options((*agg)->address()));
  Trainer resumed(again, "resume");  // CreateJob is idempotent
  SyncBatchNorm* layers[] = {&resumed.layer()};
  ASSERT_TRUE(LoadRunningStats(again, "resume", 0, layers).ok());
  EXPECT_TRUE(SameBits(resumed.layer().running_stats(), at5));
  ASSERT_TRUE(ResumeFromCheckpoint(again, "resume", 0, layers, 2).ok());
  EXPECT_TRUE(SameBits(resumed.layer().running_stats(), at2));
  EXPECT_EQ(resumed.layer().step(), 3);
  auto job = again.GetJob("resume");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->committed_step(), 2);
  // Training again from step 3 reproduces the first run bit for bit.
  for (int64_t s = 3; s <= 5; ++s) resumed.Step(s);
  EXPECT_TRUE(SameBits(resumed.layer().running_stats(), at5));
  ASSERT_TRUE(LoadRunningStats(again, "resume", 0, layers).ok());
  EXPECT_TRUE(SameBits(resumed.layer().running_stats(), at5));
  auto list = again.ListCheckpoints("resume");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].tag(), "epoch-end");
  EXPECT_EQ(again.RestoreCheckpoint("resume", 4).status().code(),
            absl::StatusCode::kNotFound);
}

// Starts the binary on `data_dir` and expects it to refuse: exit code
// `exit_code` (not a signal; 3 for damaged state, 1 for a folder it cannot
// use) and a message that names the folder.
void ExpectRefusal(const std::string& data_dir, const std::string& log,
                   const std::string& why, int exit_code = 1) {
  auto p = Subprocess::Spawn(
      {Runfile("server/syncnorm-aggregator"), "--listen=127.0.0.1:0",
       absl::StrCat("--data_dir=", data_dir)},
      log);
  ASSERT_TRUE(p.ok());
  auto code = (*p)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << why << ": the server did not exit";
  const std::string text = ReadAll(log);
  EXPECT_EQ(*code, exit_code) << why << ": " << text;
  EXPECT_TRUE(absl::StrContains(text, data_dir)) << why << ": " << text;
}

// A data_dir with state in it, stopped cleanly (so its tables are on disk).
std::string MakeState(const std::string& root) {
  auto agg = AggregatorProcess::Start(root);
  EXPECT_TRUE(agg.ok()) << agg.status();
  Client client(Options((*agg)->address()));
  Trainer t(client, "state");
  for (int64_t s = 0; s < 3; ++s) t.Step(s);
  EXPECT_TRUE(client.Checkpoint("state", 2).ok());
  EXPECT_EQ(*(*agg)->Stop(), 0);
  return root + "/data";
}

using Damage = void (*)(const fs::path& file);

void Garble(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = fs::file_size(file);
  for (uintmax_t at = size / 4; at < size * 3 / 4; at += 7) {
    f.seekp(at);
    f.put('\x5a');
  }
}

void Truncate(const fs::path& file) {
  fs::resize_file(file, fs::file_size(file) / 2);
}

TEST(StateTest, ACorruptOrTruncatedDataDirIsAClearStartupError) {
  const std::string root = MakeScratchDir("corrupt");
  const std::string pristine = MakeState(root);
  struct Case {
    const char* what;
    const char* file_kind;  // a substring of the damaged files' names
    Damage damage;
  };
  const Case cases[] = {
      {"garbled tables", ".sst", Garble},
      {"truncated tables", ".sst", Truncate},
      {"truncated manifest", "MANIFEST", Truncate},
      {"garbled CURRENT", "CURRENT", Garble},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string copy = absl::StrCat(root, "/copy", n++);
    fs::copy(pristine, copy, fs::copy_options::recursive);
    int damaged = 0;
    for (const auto& entry : fs::directory_iterator(copy)) {
      if (absl::StrContains(entry.path().filename().string(), c.file_kind) &&
          fs::file_size(entry.path()) > 0) {
        c.damage(entry.path());
        ++damaged;
      }
    }
    ASSERT_GT(damaged, 0) << c.what << ": no " << c.file_kind << " file";
    ExpectRefusal(copy, absl::StrCat(copy, ".log"), c.what, /*exit_code=*/3);
  }
  // The untouched folder still starts and serves its state.
  auto agg = AggregatorProcess::Start(root);
  ASSERT_TRUE(agg.ok()) << agg.status();
  auto stats = Client(Options((*agg)->address())).ListCheckpoints("state");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->size(), 1u);
}

TEST(StateTest, AnUnwritableDataDirIsAClearStartupError) {
  const std::string root = MakeScratchDir("unwritable");
  const std::string file = root + "/a-file";
  std::ofstream(file) << "not a folder";
  ExpectRefusal(file + "/data", root + "/under-file.log", "under a file");
  ExpectRefusal(file, root + "/is-file.log", "a file");
  // A second server on a folder in use: refused, the first one unharmed.
  auto first = AggregatorProcess::Start(root);
  ASSERT_TRUE(first.ok());
  ExpectRefusal(root + "/data", root + "/second.log", "locked");
  EXPECT_TRUE(Client(Options((*first)->address())).ListJobs().ok());
}

// Calls from several threads on one client while the server is killed and
// restarted: every call is answered once the server is back.
TEST(StateTest, BusyClientThreadsRideOutKillsAndRestarts) {
  const std::string dir = MakeScratchDir("busy-client");
  auto first = AggregatorProcess::Start(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  std::unique_ptr<AggregatorProcess> server = *std::move(first);
  const std::string address = server->address();
  Client client(Options(address));
  v1::CreateJobRequest r;
  r.set_job_id("busy");
  r.set_world_size(1);
  SyncBatchNormOptions layer;
  layer.num_features = 3;
  *r.add_layers() = *ToLayerSpec(layer, "bn");
  ASSERT_TRUE(client.CreateJob(r).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::vector<std::string> failures[4];
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        absl::StatusOr<v1::JobInfo> job = client.GetJob("busy");
        calls.fetch_add(1);
        if (!job.ok()) failures[t].push_back(job.status().ToString());
      }
    });
  }
  for (int restart = 0; restart < 6; ++restart) {
    absl::SleepFor(absl::Milliseconds(100));
    server->process().Signal(SIGKILL);
    ASSERT_TRUE(server->process().Wait(absl::Seconds(10)).ok());
    auto again =
        AggregatorProcess::Start(dir, {absl::StrCat("--listen=", address)});
    ASSERT_TRUE(again.ok()) << again.status();
    server = *std::move(again);
  }
  absl::SleepFor(absl::Milliseconds(100));
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_GT(calls.load(), 0);
  for (int t = 0; t < 4; ++t) {
    EXPECT_TRUE(failures[t].empty())
        << failures[t].size() << " failed calls in thread " << t
        << ", the first: " << failures[t][0];
  }
}

}  // namespace
}  // namespace syncnorm::testing
