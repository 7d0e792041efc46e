// Backups of a RocksDB state store under a backup root, and their restore
// into another aggregator: every record comes back bit for bit (statistics,
// steps, the retry window, checkpoints), a one-job backup holds nothing of
// the other jobs, and each way a backup or a restore can go wrong has its
// status and leaves nothing half done.
#include "server/store/backup_root.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/rocksdb_engine.h"
#include "server/store/state.pb.h"
#include "server/store/state_codec.h"

namespace syncnorm {
namespace {

namespace fs = std::filesystem;

JobSpec Spec(const std::string& id, int layers) {
  JobSpec s;
  s.job_id = id;
  s.world_size = 2;
  s.round_timeout = absl::Seconds(5);
  for (int l = 0; l < layers; ++l) {
    LayerConfig c;
    c.name = "bn" + std::to_string(l);
    c.channels = 2;
    s.layers.push_back(c);
  }
  return s;
}

Contribution Fwd(const std::string& job, int layer, int64_t step, int rank) {
  Contribution c;
  c.job_id = job;
  c.layer = layer;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  Moments m = Moments::Zero(2);
  m.count = 3 + rank;
  m.mean = {0.3 * step + rank, -0.7 * layer + 0.1 * rank};
  m.m2 = {1.25 + step, 2.5 + rank};
  c.payload = m;
  return c;
}

// Everything a store holds, encoded: equal strings mean equal records.
std::string Dump(KvStateStore& store) {
  absl::StatusOr<std::vector<JobImage>> images = store.LoadImages();
  EXPECT_TRUE(images.ok()) << images.status();
  std::string out;
  for (const JobImage& image : *images) {
    out += EncodeJob(image.job.spec);
    for (const StoredLayer& l : image.job.layers) {
      absl::StrAppend(&out, l.slot.group, "/", l.slot.layer, ":",
                      EncodeLayer(l.slot.state));
      for (const StoredRound& r : l.rounds) out += EncodeRound(r);
    }
    for (const CheckpointData& c : image.checkpoints) {
      out += EncodeCheckpoint(c);
    }
  }
  return out;
}

// The names in folder `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The files of a backup that damage can reach: all but RocksDB's info
// logs (LOG, LOG.old.*), which hold no data and which opening the folder
// rewrites, and its LOCK, an empty file that no reader needs.
std::vector<std::string> DataFiles(const std::string& folder) {
  std::vector<std::string> out;
  for (const std::string& name : Entries(folder)) {
    if (!absl::StartsWith(name, "LOG") && name != "LOCK") out.push_back(name);
  }
  return out;
}

// A server's pieces: a RocksDB store in `dir`, an aggregator on it.
struct Node {
  explicit Node(const std::string& dir, AggregatorOptions options = {}) {
    auto engine = RocksDbEngine::Open(dir, false);
    EXPECT_TRUE(engine.ok()) << engine.status();
    store = std::make_unique<KvStateStore>(*std::move(engine));
    aggregator = std::make_unique<Aggregator>(options, &clock, store.get());
    EXPECT_TRUE(aggregator->Load().ok());
  }

  RoundOutcome Send(Contribution c) {
    auto got = std::make_shared<RoundOutcome>();
    got->status = absl::InternalError("no answer yet");
    aggregator->Contribute(std::move(c),
                           [got](const RoundOutcome& o) { *got = o; });
    return *got;
  }

  void Train(const std::string& job, int layers, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      for (int l = 0; l < layers; ++l) {
        Send(Fwd(job, l, step, 0));
        RoundOutcome o = Send(Fwd(job, l, step, 1));
        ASSERT_TRUE(o.status.ok()) << o.status;
      }
    }
  }

  void Checkpoint(const std::string& job, int64_t step,
                  const std::string& tag) {
    auto got = std::make_shared<absl::Status>(absl::UnknownError("waiting"));
    aggregator->Checkpoint(
        job, step, tag, clock.Now() + absl::Seconds(5),
        [got](const absl::StatusOr<CheckpointMeta>& r) { *got = r.status(); });
    ASSERT_TRUE(got->ok()) << *got;
  }

  FakeClock clock;
  std::unique_ptr<KvStateStore> store;
  std::unique_ptr<Aggregator> aggregator;
};

class BackupRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/backup_root_test/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    source_ = std::make_unique<Node>(dir_ + "/data");
    for (const char* id : {"keep-me", "other-job"}) {
      ASSERT_TRUE(source_->aggregator->CreateJob(Spec(id, 2)).ok());
    }
    source_->Train("keep-me", 2, 0, 5);
    source_->Checkpoint("keep-me", 3, "warm");
    source_->Train("keep-me", 2, 6, 7);
    source_->Train("other-job", 2, 0, 2);
    auto root = BackupRoot::Open(dir_ + "/backups", source_->store.get(),
                                 &source_->clock);
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = *std::move(root);
  }

  std::string dir_;
  std::unique_ptr<Node> source_;
  std::unique_ptr<BackupRoot> root_;
};

TEST_F(BackupRootTest, AFullBackupOpensAsADataDirWithEveryRecordBitForBit) {
  source_->clock.Advance(absl::Hours(1));
  auto made = root_->Create("nightly", 0, "");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->name, "nightly");
  EXPECT_EQ(made->path, dir_ + "/backups/nightly/shard-0");
  EXPECT_EQ(made->created, source_->clock.Now());
  EXPECT_GT(made->bytes, 0);
  ASSERT_EQ(made->jobs.size(), 2u);
  EXPECT_EQ(made->jobs[0].spec.job_id, "keep-me");
  EXPECT_EQ(made->jobs[0].committed_step, 7);
  EXPECT_EQ(made->jobs[1].committed_step, 2);
  // Rounds after the backup are not in it.
  source_->Train("keep-me", 2, 8, 8);
  const std::string after = Dump(*source_->store);

  Node copy(made->path);
  // The copy's records equal the source's as of the backup: train the copy
  // the same round and both dumps agree.
  copy.Train("keep-me", 2, 8, 8);
  EXPECT_EQ(Dump(*copy.store), after);

  std::vector<BackupSummary> listed = root_->List(0);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "nightly");
  EXPECT_EQ(listed[0].jobs.size(), 2u);
  EXPECT_TRUE(root_->List(1).empty());
}

TEST_F(BackupRootTest, RestoreIntoAnEmptyServerGivesBackEveryRecord) {
  auto made = root_->Create("before-loss", 0, "");
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string before = Dump(*source_->store);
  auto stats_before = source_->aggregator->GetRunningStats("keep-me", {}, 0);
  ASSERT_TRUE(stats_before.ok());

  // A new server on an empty volume, restored from the backup.
  Node fresh(dir_ + "/fresh");
  auto root =
      BackupRoot::Open(dir_ + "/backups", fresh.store.get(), &fresh.clock);
  ASSERT_TRUE(root.ok());
  BackupSummary summary;
  auto images = (*root)->Read("before-loss", 0, "", &summary);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(summary.jobs.size(), 2u);
  auto restored =
      fresh.aggregator->RestoreJobs(*std::move(images), false, "before-loss");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 2u);
  EXPECT_TRUE((*restored)[0].restored);
  EXPECT_EQ((*restored)[0].committed_step, 7);
  EXPECT_EQ(Dump(*fresh.store), before);

  auto stats = fresh.aggregator->GetRunningStats("keep-me", {}, 0);
  ASSERT_TRUE(stats.ok());
  for (size_t l = 0; l < stats->layers.size(); ++l) {
    EXPECT_EQ(stats->layers[l].stats.mean, stats_before->layers[l].stats.mean);
    EXPECT_EQ(stats->layers[l].stats.var, stats_before->layers[l].stats.var);
  }
  // A retry of the last round gets the stored answer; the next step
  // applies; the checkpoint restores.
  RoundOutcome retry = fresh.Send(Fwd("keep-me", 1, 7, 1));
  RoundOutcome original = source_->Send(Fwd("keep-me", 1, 7, 1));
  ASSERT_TRUE(retry.status.ok()) << retry.status;
  EXPECT_EQ(retry.moments.mean, original.moments.mean);
  EXPECT_EQ(retry.version, original.version);
  fresh.Train("keep-me", 2, 8, 8);
  source_->Train("keep-me", 2, 8, 8);
  EXPECT_EQ(Dump(*fresh.store), Dump(*source_->store));
  ASSERT_TRUE(fresh.aggregator->RestoreCheckpoint("keep-me", 3).ok());
  auto at3 = fresh.aggregator->GetRunningStats("keep-me", {}, 0, 3);
  auto now = fresh.aggregator->GetRunningStats("keep-me", {}, 0);
  ASSERT_TRUE(at3.ok() && now.ok());
  EXPECT_EQ(now->layers[0].stats.mean, at3->layers[0].stats.mean);
  EXPECT_EQ(now->committed_step, 3);

  // The restored jobs survive a restart of the fresh server.
  const std::string restored_dump = Dump(*fresh.store);
  fresh.aggregator.reset();
  fresh.store.reset();
  Node again(dir_ + "/fresh");
  EXPECT_EQ(Dump(*again.store), restored_dump);
}

TEST_F(BackupRootTest, AOneJobBackupHoldsNothingOfTheOthers) {
  auto made = root_->Create("just-one", 0, "keep-me");
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_EQ(made->jobs.size(), 1u);
  EXPECT_EQ(made->job_id, "keep-me");
  // Not a key, not a byte of the other job in any file of the backup.
  for (const auto& entry : fs::directory_iterator(made->path)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    EXPECT_FALSE(absl::StrContains(bytes, "other-job")) << entry.path();
  }
  auto images = root_->Read("just-one", 0, "", nullptr);
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 1u);
  EXPECT_EQ((*images)[0].job.spec.job_id, "keep-me");
  EXPECT_EQ((*images)[0].checkpoints.size(), 1u);
}

TEST_F(BackupRootTest, AHeldJobIsKeptUnlessReplacedAndItsRoundsThenAbort) {
  ASSERT_TRUE(root_->Create("b", 0, "").ok());
  source_->Train("keep-me", 2, 8, 9);
  auto images = root_->Read("b", 0, "keep-me", nullptr);
  ASSERT_TRUE(images.ok());
  auto kept = source_->aggregator->RestoreJobs(*images, false, "b");
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE((*kept)[0].restored);
  EXPECT_TRUE(absl::StrContains((*kept)[0].note, "committed step 9"))
      << (*kept)[0].note;
  EXPECT_EQ(source_->aggregator->GetJob("keep-me")->committed_step, 9);

  // A round waiting on the job when it is replaced fails ABORTED.
  auto waiting = std::make_shared<RoundOutcome>();
  source_->aggregator->Contribute(
      Fwd("keep-me", 0, 10, 0),
      [waiting](const RoundOutcome& o) { *waiting = o; });
  auto replaced = source_->aggregator->RestoreJobs(*images, true, "b");
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE((*replaced)[0].restored);
  EXPECT_EQ((*replaced)[0].committed_step, 7);
  EXPECT_EQ(waiting->status.code(), absl::StatusCode::kAborted)
      << waiting->status;
  EXPECT_TRUE(absl::StrContains(waiting->status.message(), "backup 'b'"));
  EXPECT_EQ(source_->aggregator->GetJob("keep-me")->committed_step, 7);
  // Steps after the backup are taken again.
  source_->Train("keep-me", 2, 8, 8);
  EXPECT_EQ(source_->aggregator->GetJob("keep-me")->committed_step, 8);
}

TEST_F(BackupRootTest, EveryRefusalIsPreciseAndLeavesNothingBehind) {
  EXPECT_EQ(root_->Create("../escape", 0, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root_->Create(".hidden", 0, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root_->Create("ok", -1, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto unknown = root_->Create("nobody", 0, "no-such-job");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir_ + "/backups/nobody"));
  // A refusal under a name that another shard's backup holds leaves that
  // backup, and nothing of its own.
  ASSERT_TRUE(root_->Create("shared", 1, "").ok());
  EXPECT_EQ(root_->Create("shared", 0, "no-such-job").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Entries(dir_ + "/backups/shared"),
            std::vector<std::string>{"shard-1"});
  ASSERT_TRUE(root_->Create("twice", 0, "").ok());
  EXPECT_EQ(root_->Create("twice", 0, "").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(root_->Create("twice", 1, "").ok());  // another shard's folder

  auto missing = root_->Read("never", 0, "", nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "ListBackups"));
  EXPECT_EQ(root_->Read("twice", 0, "no-such-job", nullptr).status().code(),
            absl::StatusCode::kNotFound);

  // A damaged manifest, or a table file cut short: DATA_LOSS, nothing read.
  ASSERT_TRUE(root_->Create("damaged", 0, "").ok());
  std::ofstream(dir_ + "/backups/damaged/shard-0/SYNCNORM_BACKUP",
                std::ios::trunc)
      << "not a manifest";
  EXPECT_EQ(root_->Read("damaged", 0, "", nullptr).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(root_->List(0).size(), 1u);  // "twice", not the damaged one

  // A crash during a backup leaves a hidden folder: not listed, and the
  // next backup of that name clears it.
  fs::create_directories(dir_ + "/backups/retry/.shard-0.partial");
  EXPECT_EQ(root_->List(0).size(), 1u);
  EXPECT_TRUE(root_->Create("retry", 0, "").ok());
  EXPECT_FALSE(fs::exists(dir_ + "/backups/retry/.shard-0.partial"));

  // A store in memory has nothing durable to copy.
  FakeClock clock;
  KvStateStore memory(std::make_unique<MemoryEngine>());
  auto in_memory = BackupRoot::Open(dir_ + "/backups", &memory, &clock);
  ASSERT_TRUE(in_memory.ok());
  auto refused = (*in_memory)->Create("mem", 0, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(dir_ + "/backups/mem"));
  // Of every refusal above, nothing but the backups that were made.
  EXPECT_EQ(Entries(dir_ + "/backups"),
            (std::vector<std::string>{"damaged", "retry", "shared", "twice"}));

  // A root that cannot be created.
  EXPECT_EQ(
      BackupRoot::Open("/proc/no-such-root", &memory, &clock).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST_F(BackupRootTest, AShardedJobIsRestoredOnlyAsItsOwnShard) {
  JobSpec spec = Spec("sharded", 3);
  spec.shard.shard = 1;
  spec.shard.num_shards = 2;
  spec.shard.owned_layers = {0, 2};
  ASSERT_TRUE(source_->aggregator->CreateJob(spec).ok());
  // Asked as shard 0 (a client that names this server alone): the backup
  // holds every job, and a restore as shard 0 leaves the sharded one out.
  ASSERT_TRUE(root_->Create("as-zero", 0, "").ok());
  std::vector<JobRestore> left_out;
  auto images = root_->Read("as-zero", 0, "", nullptr, &left_out);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->size(), 2u);
  ASSERT_EQ(left_out.size(), 1u);
  EXPECT_EQ(left_out[0].job_id, "sharded");
  EXPECT_FALSE(left_out[0].restored);
  EXPECT_TRUE(absl::StrContains(left_out[0].note, "shard 1's part"))
      << left_out[0].note;
  auto asked = root_->Read("as-zero", 0, "sharded", nullptr);
  EXPECT_EQ(asked.status().code(), absl::StatusCode::kFailedPrecondition);
  // As its own shard it is read.
  ASSERT_TRUE(root_->Create("as-one", 1, "sharded").ok());
  images = root_->Read("as-one", 1, "", nullptr);
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 1u);
  EXPECT_EQ((*images)[0].job.spec.shard.owned_layers, (std::vector<int>{0, 2}));
}

TEST_F(BackupRootTest, RestoreRespectsTheJobLimitWithNothingLoaded) {
  ASSERT_TRUE(root_->Create("b", 0, "").ok());
  AggregatorOptions options;
  options.limits.max_jobs = 1;
  Node small(dir_ + "/small", options);
  auto images = root_->Read("b", 0, "", nullptr);
  ASSERT_TRUE(images.ok());
  auto refused = small.aggregator->RestoreJobs(*images, false, "b");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--max_jobs=1"))
      << refused.status();
  EXPECT_TRUE(small.aggregator->ListJobs().empty());
  EXPECT_EQ(Dump(*small.store), "");
}

// A backup is a copy: no file of it shares its storage with the data dir
// (a hard link would: damage to either would be damage to both).
TEST_F(BackupRootTest, ABackupSharesNoFileWithTheDataDir) {
  auto made = root_->Create("copy", 0, "");
  ASSERT_TRUE(made.ok()) << made.status();
  int tables = 0;
  for (const auto& entry : fs::directory_iterator(made->path)) {
    struct stat st;
    ASSERT_EQ(::stat(entry.path().c_str(), &st), 0) << entry.path();
    EXPECT_EQ(st.st_nlink, 1u) << entry.path();
    if (entry.path().extension() == ".sst") ++tables;
  }
  EXPECT_GT(tables, 0);
  // Damage to the live tables leaves the backup whole.
  for (const auto& entry : fs::directory_iterator(dir_ + "/data")) {
    if (entry.path().extension() != ".sst") continue;
    std::fstream f(entry.path(),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('\xff');
  }
  auto images = root_->Read("copy", 0, "", nullptr);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->size(), 2u);
}

// Every way a backup's files can be damaged (one deleted, cut short, a
// byte flipped at random) is DATA_LOSS naming the backup and the file,
// never UNAVAILABLE or NOT_FOUND, and reads nothing; the live store is
// untouched. The flips are drawn from a fixed seed, bounded in number.
TEST_F(BackupRootTest, EveryDamageToABackupIsDataLossNamingTheFile) {
  ASSERT_TRUE(root_->Create("pristine", 0, "").ok());
  const std::string pristine = dir_ + "/backups/pristine/shard-0";
  const std::vector<std::string> files = DataFiles(pristine);
  for (const char* kind :
       {"MANIFEST-", "CURRENT", "OPTIONS-", ".sst", "SYNCNORM_BACKUP"}) {
    EXPECT_TRUE(std::any_of(
        files.begin(), files.end(),
        [&](const std::string& f) { return absl::StrContains(f, kind); }))
        << "no " << kind << " file in the backup to damage";
  }
  const std::string live = Dump(*source_->store);
  std::mt19937 random(20261206);
  constexpr int kFlipsPerFile = 4;
  int trial = 0;
  for (const std::string& file : files) {
    const uintmax_t size = fs::file_size(pristine + "/" + file);
    std::vector<std::string> damages = {"deleted"};
    if (size > 0) damages.push_back("cut short");
    for (int i = 0; size > 0 && i < kFlipsPerFile; ++i) {
      damages.push_back("flipped");
    }
    for (const std::string& damage : damages) {
      const std::string name = absl::StrCat("damaged-", trial++);
      const std::string folder = absl::StrCat(dir_, "/backups/", name);
      fs::create_directories(folder);
      fs::copy(pristine, folder + "/shard-0", fs::copy_options::recursive);
      const std::string path = folder + "/shard-0/" + file;
      std::string what = damage;
      if (damage == "deleted") {
        fs::remove(path);
      } else if (damage == "cut short") {
        fs::resize_file(path, size / 2);
      } else {
        const uintmax_t at =
            std::uniform_int_distribution<uintmax_t>(0, size - 1)(random);
        const int bit = std::uniform_int_distribution<int>(0, 7)(random);
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(at);
        const char c = static_cast<char>(f.get() ^ (1 << bit));
        f.seekp(at);
        f.put(c);
        what = absl::StrCat("bit ", bit, " of byte ", at, " flipped");
      }
      auto read = root_->Read(name, 0, "", nullptr);
      EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
          << file << " " << what << ": " << read.status();
      EXPECT_TRUE(absl::StrContains(read.status().message(), name))
          << read.status();
      EXPECT_TRUE(absl::StrContains(read.status().message(), file))
          << file << " " << what << ": " << read.status();
      fs::remove_all(folder);
    }
  }
  // The undamaged backup still reads, and the live store never moved.
  auto read = root_->Read("pristine", 0, "", nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 2u);
  EXPECT_EQ(Dump(*source_->store), live);
}

// A backup written before files were listed (a manifest without files or
// checksum) still reads, and its damage is still DATA_LOSS, found as
// RocksDB opens it.
TEST_F(BackupRootTest, ABackupWithoutAFileListReadsAndItsDamageIsDataLoss) {
  ASSERT_TRUE(root_->Create("old", 0, "").ok());
  const std::string folder = dir_ + "/backups/old/shard-0";
  storage::BackupManifest manifest;
  {
    std::ifstream in(folder + "/SYNCNORM_BACKUP", std::ios::binary);
    ASSERT_TRUE(manifest.ParseFromIstream(&in));
  }
  ASSERT_GT(manifest.files_size(), 0);
  manifest.clear_files();
  manifest.clear_crc32c();
  {
    std::ofstream out(folder + "/SYNCNORM_BACKUP",
                      std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(manifest.SerializeToOstream(&out));
  }
  auto read = root_->Read("old", 0, "", nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 2u);
  for (const std::string& file : DataFiles(folder)) {
    if (absl::StartsWith(file, "MANIFEST-")) fs::remove(folder + "/" + file);
  }
  read = root_->Read("old", 0, "", nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "old/shard-0"))
      << read.status();
}

}  // namespace
}  // namespace syncnorm
