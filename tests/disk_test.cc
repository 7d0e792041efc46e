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
  explicit Stub(const std::string& address)
      : stub_(v1::Aggregator::NewStub(grpc::CreateChannel(
            address, grpc::InsecureChannelCredentials()))) {}

  grpc::Status Forward(int64_t step, v1::RoundResult* out) {
    v1::Contribution c;
    c.set_job_id("full");
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.mutable_moments()->set_count(2);
    for (int i = 0; i < kChannels; ++i) {
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
    r.add_layers()->set_num_features(kChannels);
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
};

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
  auto p = Subprocess::Spawn(
      {Runfile("server/syncnorm-aggregator"), "--listen=127.0.0.1:0",
       "--data_dir=" + data, "--round_log_mib=0"},
      log);
  ASSERT_TRUE(p.ok());
  auto code = (*p)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), "--round_log_mib must be"))
      << ReadAll(log);
  EXPECT_EQ(file_bytes(), int64_t{5} << 20) << "a refused start changed it";
}

TEST(DiskTest, AReadOnlyDataDirIsAClearStartupError) {
  const std::string root = MakeScratchDir("readonly");
  const std::string mnt = root + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  const std::string why = MountTmpfs(mnt, 1, /*read_only=*/true);
  if (!why.empty()) GTEST_SKIP() << "no read-only tmpfs (" << why << ")";
  const std::string log = root + "/ro.log";
  auto p =
      Subprocess::Spawn({Runfile("server/syncnorm-aggregator"),
                         "--listen=127.0.0.1:0", "--data_dir=" + mnt + "/data"},
                        log);
  ASSERT_TRUE(p.ok());
  auto code = (*p)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), mnt)) << ReadAll(log);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), "Read-only")) << ReadAll(log);
}

}  // namespace
}  // namespace syncnorm::testing
