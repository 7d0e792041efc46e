// The aggregator on a full disk and on a read-only one, for real: a small
// tmpfs mounted in a mount namespace of this test's own (so nothing leaks
// to the machine; needs root, skipped otherwise). Rounds go on into the
// round log, whose file was allocated whole, until it is full; then a
// round fails with a clear error and applies nothing, and nothing that was
// acknowledged is lost, also across a kill -9. And the round log's size
// flag, for real.
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

constexpr int kChannels = 1024;

// Mounts a tmpfs of `megabytes` at `dir` in a private mount namespace of
// the calling thread (children started from it see it). Empty on success,
// else why not.
std::string MountTmpfs(const std::string& dir, int megabytes,
                       bool read_only = false) {
  if (::unshare(CLONE_NEWNS) != 0) {
    return absl::StrCat("unshare(CLONE_NEWNS): ", std::strerror(errno));
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::StrCat("making / private: ", std::strerror(errno));
  }
  const std::string size = absl::StrCat("size=", megabytes, "m");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", read_only ? MS_RDONLY : 0,
              size.c_str()) != 0) {
    return absl::StrCat("mount tmpfs: ", std::strerror(errno));
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Stub {
 public:
  explicit Stub(const std::string& address, int channels = kChannels)
      : stub_(v1::Aggregator::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        channels_(channels) {}

  grpc::Status Forward(int64_t step, v1::RoundResult* out) {
    v1::Contribution c;
    c.set_job_id("full");
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.mutable_moments()->set_count(2);
    for (int i = 0; i < channels_; ++i) {
      c.mutable_moments()->add_mean(0.25 * i + step);
      c.mutable_moments()->add_m2(1.0 + i);
    }
    return Call([&](grpc::ClientContext* ctx) {
      return stub_->ReduceOnce(ctx, c, out);
    });
  }

  grpc::Status Stats(v1::RunningStats* out) {
    v1::GetRunningStatsRequest r;
    r.set_job_id("full");
    return Call([&](grpc::ClientContext* ctx) {
      return stub_->GetRunningStats(ctx, r, out);
    });
  }

  grpc::Status Create() {
    v1::CreateJobRequest r;
    r.set_job_id("full");
    r.set_world_size(1);
    r.add_layers()->set_num_features(channels_);
    v1::JobInfo info;
    return Call([&](grpc::ClientContext* ctx) {
      return stub_->CreateJob(ctx, r, &info);
    });
  }

 private:
  // A call, resent while the connection to a killed server is still being
  // noticed (UNAVAILABLE: broken pipe).
  template <typename F>
  grpc::Status Call(F f) {
    grpc::Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      s = f(&ctx);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return s;
  }

  std::unique_ptr<v1::Aggregator::Stub> stub_;
  const int channels_;
};

// Runs the aggregator with `flags` until it exits, its log in `log`; its
// exit code, or an error if it did not exit within 30 s.
absl::StatusOr<int> RunToExit(const std::vector<std::string>& flags,
                              const std::string& log) {
  std::vector<std::string> argv = {Runfile("server/syncnorm-aggregator")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv, log);
  if (!p.ok()) return p.status();
  return (*p)->Wait(absl::Seconds(30));
}

// Fills the file system of `path` with a file `path` until it is full.
void FillUp(const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  const std::string block(1 << 20, 'x');
  while (out.write(block.data(), block.size())) {
  }
}

TEST(DiskTest, AFullDiskFailsRoundsClearlyAndLosesNothingAcknowledged) {
  const std::string root = MakeScratchDir("full");
  const std::string mnt = root + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  // Room for the round log (32 MiB, below the default), RocksDB, and the
  // 17 MiB that the server needs free to start.
  const std::string why = MountTmpfs(mnt, 80);
  if (!why.empty()) GTEST_SKIP() << "no tmpfs to fill (" << why << ")";
  const std::vector<std::string> flags = {"--data_dir=" + mnt + "/data",
                                          "--round_log_mib=32"};
  auto agg = AggregatorProcess::Start(root, flags);
  ASSERT_TRUE(agg.ok()) << agg.status();
  const std::string address = (*agg)->address();
  std::vector<std::string> same_port = flags;
  same_port.push_back("--listen=" + address);
  Stub stub(address);
  ASSERT_TRUE(stub.Create().ok());
  v1::RoundResult r;
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(stub.Forward(step, &r).ok());
  }
  FillUp(mnt + "/filler");
  // RocksDB can take nothing more; the round log takes rounds until it is
  // full, and then the round that needs RocksDB to take what it holds
  // fails.
  int64_t acknowledged = 5;
  grpc::Status failed;
  while (acknowledged < 5000 &&
         (failed = stub.Forward(acknowledged, &r)).ok()) {
    ++acknowledged;
  }
  EXPECT_GT(acknowledged, 5) << "the round log took no round";
  std::fprintf(stderr, "full disk: the round log took %lld rounds more\n",
               static_cast<long long>(acknowledged - 5));
  const std::string log = root + "/aggregator.log";
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << failed.error_message() << "\n"
      << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(failed.error_message(), "not applied"))
      << failed.error_message();
  EXPECT_TRUE(absl::StrContains(failed.error_message(), "is full"))
      << failed.error_message();
  // The server is alive, serves reads, and applied nothing more.
  v1::RunningStats stats;
  ASSERT_TRUE(stub.Stats(&stats).ok()) << ReadAll(log);
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), acknowledged);
  // Killed, then started on the still full disk: a clear refusal.
  (*agg)->process().Signal(SIGKILL);
  ASSERT_TRUE((*agg)->process().Wait(absl::Seconds(10)).ok());
  const std::string refused = root + "/refused.log";
  auto p =
      Subprocess::Spawn({Runfile("server/syncnorm-aggregator"),
                         "--listen=" + address, "--data_dir=" + mnt + "/data"},
                        refused);
  ASSERT_TRUE(p.ok());
  auto code = (*p)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << ReadAll(refused);
  EXPECT_TRUE(absl::StrContains(ReadAll(refused), "is full"))
      << ReadAll(refused);
  EXPECT_TRUE(absl::StrContains(ReadAll(refused), mnt)) << ReadAll(refused);
  // With room again, all is there and the round goes through.
  ASSERT_EQ(std::remove((mnt + "/filler").c_str()), 0);
  agg = AggregatorProcess::Start(root, same_port);
  ASSERT_TRUE(agg.ok()) << agg.status();
  Stub fresh(address);
  grpc::Status read = fresh.Stats(&stats);
  ASSERT_TRUE(read.ok()) << read.error_message() << "\n" << ReadAll(log);
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), acknowledged);
  grpc::Status ok = fresh.Forward(acknowledged, &r);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(r.version(), acknowledged + 1);
}

// --round_log_mib sizes the round log's file; a restart with another size
// replays what the old one held first, so nothing acknowledged is lost; a
// size out of range is a clear startup error naming the flag.
TEST(DiskTest, TheRoundLogTakesItsSizeFromTheFlag) {
  const std::string root = MakeScratchDir("ringsize");
  const std::string data = root + "/data";
  const std::string ring = data + "/syncnorm-round-log";
  auto file_bytes = [&ring] {
    struct stat st;
    return ::stat(ring.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size)
                                          : int64_t{-1};
  };
  auto agg = AggregatorProcess::Start(
      root, {"--data_dir=" + data, "--round_log_mib=2"});
  ASSERT_TRUE(agg.ok()) << agg.status();
  std::string address = (*agg)->address();
  EXPECT_EQ(file_bytes(), int64_t{2} << 20);
  v1::RoundResult r;
  {
    Stub stub(address);
    ASSERT_TRUE(stub.Create().ok());
    for (int64_t step = 0; step < 20; ++step) {
      ASSERT_TRUE(stub.Forward(step, &r).ok());
    }
  }
  // Killed: the last rounds are only in the 2 MiB ring.
  (*agg)->process().Signal(SIGKILL);
  ASSERT_TRUE((*agg)->process().Wait(absl::Seconds(10)).ok());
  agg = AggregatorProcess::Start(
      root, {"--data_dir=" + data, "--round_log_mib=5", "--listen=" + address});
  ASSERT_TRUE(agg.ok()) << agg.status();
  EXPECT_EQ(file_bytes(), int64_t{5} << 20);
  Stub stub(address);
  v1::RunningStats stats;
  ASSERT_TRUE(stub.Stats(&stats).ok());
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 20);
  ASSERT_TRUE(stub.Forward(20, &r).ok());
  EXPECT_EQ(r.version(), 21);
  ASSERT_TRUE((*agg)->Stop().ok());

  const std::string log = root + "/refused.log";
  absl::StatusOr<int> code = RunToExit(
      {"--listen=127.0.0.1:0", "--data_dir=" + data, "--round_log_mib=0"}, log);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), "--round_log_mib must be"))
      << ReadAll(log);
  EXPECT_EQ(file_bytes(), int64_t{5} << 20) << "a refused start changed it";
}

// The round log's record headers in the file at `path`, by the format of
// server/store/ring_log_engine.cc (8-byte aligned; u32 magic "NSRL", u32
// kind, u64 sequence number, u32 length, u32 checksum): file offset by
// sequence number of every batch record whose header is there.
std::map<uint64_t, int64_t> RecordOffsets(const std::string& path) {
  const std::string file = ReadAll(path);
  std::map<uint64_t, int64_t> out;
  for (size_t at = 0; at + 24 <= file.size(); at += 8) {
    uint32_t magic, kind;
    uint64_t seq;
    std::memcpy(&magic, file.data() + at, 4);
    std::memcpy(&kind, file.data() + at + 4, 4);
    std::memcpy(&seq, file.data() + at + 8, 8);
    if (magic == 0x4c52534e && kind == 1) out[seq] = static_cast<int64_t>(at);
  }
  return out;
}

// The damage, end to end: 20 rounds acknowledged, the server
// killed before they reach RocksDB, one payload byte of round 11's record
// flipped. The start stops (exit code 3, one error line naming the file,
// the offset and the 8 rounds after it). Started once with
// --round_log_recovery=point_in_time, it serves 11 rounds and takes round
// 20 as the 12th; killed and started again as usual, it still serves those
// 12: the rounds dropped never come back.
TEST(DiskTest, ADamagedRoundLogStopsTheStartUntilTheLossIsAccepted) {
  const std::string root = MakeScratchDir("damaged");
  const std::string data = root + "/data";
  const std::string ring = data + "/syncnorm-round-log";
  auto agg = AggregatorProcess::Start(
      root, {"--data_dir=" + data, "--round_log_mib=1"});
  ASSERT_TRUE(agg.ok()) << agg.status();
  const std::string address = (*agg)->address();
  v1::RoundResult r;
  {
    Stub stub(address, 8);
    ASSERT_TRUE(stub.Create().ok());
    absl::SleepFor(absl::Milliseconds(1200));  // the job reaches RocksDB
    for (int64_t step = 0; step < 20; ++step) {
      ASSERT_TRUE(stub.Forward(step, &r).ok());
    }
  }
  (*agg)->process().Signal(SIGKILL);
  ASSERT_TRUE((*agg)->process().Wait(absl::Seconds(10)).ok());
  const std::map<uint64_t, int64_t> records = RecordOffsets(ring);
  ASSERT_GE(records.size(), 20u);
  // Round 11 is the 9th record from the newest: one record per round.
  auto round11 = std::prev(records.end(), 9);
  const int64_t offset = round11->second;
  {
    std::fstream f(ring, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset + 100);
    const char c = static_cast<char>(f.get());
    f.seekp(offset + 100);
    f.put(static_cast<char>(c ^ 0x10));
  }

  const std::string log = root + "/refused.log";
  absl::StatusOr<int> code = RunToExit(
      {"--listen=" + address, "--data_dir=" + data, "--round_log_mib=1"}, log);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3) << ReadAll(log);
  const std::string said = ReadAll(log);
  EXPECT_TRUE(absl::StrContains(said, "level=error event=start_failed"))
      << said;
  EXPECT_TRUE(absl::StrContains(said, ring)) << said;
  EXPECT_TRUE(absl::StrContains(said, absl::StrCat("offset ", offset))) << said;
  EXPECT_TRUE(absl::StrContains(said, "8 valid newer records")) << said;
  EXPECT_TRUE(absl::StrContains(said, "--round_log_recovery=point_in_time"))
      << said;

  agg = AggregatorProcess::Start(
      root, {"--data_dir=" + data, "--round_log_mib=1", "--listen=" + address,
             "--round_log_recovery=point_in_time"});
  ASSERT_TRUE(agg.ok()) << agg.status();
  {
    Stub stub(address, 8);
    v1::RunningStats stats;
    ASSERT_TRUE(stub.Stats(&stats).ok());
    EXPECT_EQ(stats.layers(0).num_batches_tracked(), 11);
    ASSERT_TRUE(stub.Forward(20, &r).ok());
    EXPECT_EQ(r.version(), 12);
  }
  (*agg)->process().Signal(SIGKILL);
  ASSERT_TRUE((*agg)->process().Wait(absl::Seconds(10)).ok());
  const std::string accepted = ReadAll(root + "/aggregator.log");
  EXPECT_TRUE(
      absl::StrContains(accepted, "level=error event=round_log_loss_accepted"))
      << accepted;

  agg = AggregatorProcess::Start(
      root, {"--data_dir=" + data, "--round_log_mib=1", "--listen=" + address});
  ASSERT_TRUE(agg.ok()) << agg.status();
  Stub stub(address, 8);
  v1::RunningStats stats;
  ASSERT_TRUE(stub.Stats(&stats).ok());
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 12)
      << "the acknowledged round 20 was lost, or dropped rounds came back";
  ASSERT_TRUE(stub.Forward(21, &r).ok());
  EXPECT_EQ(r.version(), 13);
  ASSERT_TRUE((*agg)->Stop().ok());
}

TEST(DiskTest, AReadOnlyDataDirIsAClearStartupError) {
  const std::string root = MakeScratchDir("readonly");
  const std::string mnt = root + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  const std::string why = MountTmpfs(mnt, 1, /*read_only=*/true);
  if (!why.empty()) GTEST_SKIP() << "no read-only tmpfs (" << why << ")";
  const std::string log = root + "/ro.log";
  absl::StatusOr<int> code =
      RunToExit({"--listen=127.0.0.1:0", "--data_dir=" + mnt + "/data"}, log);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), mnt)) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), "Read-only")) << ReadAll(log);
}

}  // namespace
}  // namespace syncnorm::testing
