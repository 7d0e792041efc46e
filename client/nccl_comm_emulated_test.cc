// client/nccl_comm.cc itself (not the fake communicator) on the CUDA
// emulator (kernels/emulator), with a fake NCCL of one-rank communicators
// (client/fake_nccl): the caller's current device across Create, the
// collectives and teardown; device -1; the kinds of failures, deadlines
// and aborts; a node round (client/nccl_round.h) over it, a stale answer's
// view included. Runs everywhere; the device check runs the same code on
// GPUs.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "client/fake_nccl/fake_nccl.h"
#include "client/nccl_comm.h"
#include "client/nccl_round.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/emulator/emulator.h"

namespace syncnorm::nccl {
namespace {

using ::testing::HasSubstr;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

int CurrentDevice() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

class NcclCommEmulatedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    emu::Config config;
    config.devices = 2;
    config.queries_run_work = true;  // the communicator polls its stream
    emu::Reset(config);
    fake_nccl::Reset();
  }

  std::unique_ptr<Comm> Make(int device, int64_t timeout_ms = 10000) {
    std::string id;
    EXPECT_TRUE(NewUniqueId(&id).ok());
    std::unique_ptr<Comm> comm;
    const CommResult r = Comm::Create(id, 1, 0, device, timeout_ms, &comm);
    EXPECT_TRUE(r.ok()) << r.message;
    return comm;
  }
};

TEST_F(NcclCommEmulatedTest, DeviceMinusOneIsTheCurrentDevice) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  std::unique_ptr<Comm> comm = Make(-1);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->device(), 1);
  EXPECT_EQ(fake_nccl::InitDevices(), std::vector<int>{1});
}

TEST_F(NcclCommEmulatedTest, TheCallersDeviceIsRestoredEverywhere) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  std::unique_ptr<Comm> comm = Make(0);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(fake_nccl::InitDevices(), std::vector<int>{0});
  EXPECT_EQ(CurrentDevice(), 1) << "after Create";
  const std::vector<double> send = {1.5, -2.25, 3e300, 7};
  std::vector<double> recv(4, 0.0);
  ASSERT_TRUE(comm->AllGather(send.data(), recv.data(), 4).ok());
  EXPECT_EQ(recv, send);
  EXPECT_EQ(CurrentDevice(), 1) << "after a collective";
  recv.assign(4, 0.0);
  ASSERT_TRUE(comm->AllReduceSum(send.data(), recv.data(), 4).ok());
  EXPECT_EQ(recv, send);
  std::vector<double> buffer = send;
  ASSERT_TRUE(comm->Broadcast(buffer.data(), 32, 0).ok());
  EXPECT_EQ(buffer, send);
  EXPECT_EQ(CurrentDevice(), 1);
  comm.reset();
  EXPECT_EQ(CurrentDevice(), 1) << "after teardown";
  EXPECT_EQ(fake_nccl::Live(), 0);
}

TEST_F(NcclCommEmulatedTest, AFailedCollectiveAbortsAndLaterCallsAreAborted) {
  std::unique_ptr<Comm> comm = Make(-1);
  ASSERT_NE(comm, nullptr);
  std::vector<double> v(4, 1.0), w(4);
  fake_nccl::SetNext(fake_nccl::Next::kFail);
  CommResult r = comm->AllGather(v.data(), w.data(), 4);
  EXPECT_EQ(r.kind, CommResult::kFailed) << r.message;
  EXPECT_THAT(r.message, HasSubstr("a failure the test asked for"));
  EXPECT_TRUE(comm->aborted());
  EXPECT_EQ(fake_nccl::Live(), 0);  // the NCCL communicator was aborted
  r = comm->Broadcast(v.data(), 32, 0);
  EXPECT_EQ(r.kind, CommResult::kAborted);
  EXPECT_THAT(r.message, HasSubstr("aborted after an earlier failure"));
}

TEST_F(NcclCommEmulatedTest, AHungCollectiveTimesOutInTimeThenCallsAreAborted) {
  std::unique_ptr<Comm> comm = Make(-1, /*timeout_ms=*/300);
  ASSERT_NE(comm, nullptr);
  std::vector<double> v(4, 1.0), w(4);
  fake_nccl::SetNext(fake_nccl::Next::kHang);
  auto start = std::chrono::steady_clock::now();
  CommResult r = comm->AllGather(v.data(), w.data(), 4);
  const double s = Seconds(start);
  EXPECT_EQ(r.kind, CommResult::kTimeout) << r.message;
  EXPECT_GE(s, 0.29);
  EXPECT_LT(s, 10.0);
  start = std::chrono::steady_clock::now();
  r = comm->AllGather(v.data(), w.data(), 4);
  EXPECT_EQ(r.kind, CommResult::kAborted);
  EXPECT_LT(Seconds(start), 1.0);
  comm.reset();  // teardown of an aborted communicator returns at once
  EXPECT_EQ(fake_nccl::Live(), 0);
}

// The broadcast's extra time extends its deadline (the node leader's
// budget upstream).
TEST_F(NcclCommEmulatedTest, ABroadcastWaitsItsExtraTime) {
  std::unique_ptr<Comm> comm = Make(-1, /*timeout_ms=*/200);
  ASSERT_NE(comm, nullptr);
  std::vector<double> v(4, 1.0);
  fake_nccl::SetNext(fake_nccl::Next::kHang);
  const auto start = std::chrono::steady_clock::now();
  const CommResult r = comm->Broadcast(v.data(), 32, 0, /*extra_ms=*/800);
  const double s = Seconds(start);
  EXPECT_EQ(r.kind, CommResult::kTimeout);
  EXPECT_THAT(r.message, HasSubstr("within 1000 ms"));
  EXPECT_GE(s, 0.99);
}

TEST_F(NcclCommEmulatedTest, AMissingRankIsATimeoutAtCreate) {
  std::string id;
  ASSERT_TRUE(NewUniqueId(&id).ok());
  std::unique_ptr<Comm> comm;
  const auto start = std::chrono::steady_clock::now();
  const CommResult r = Comm::Create(id, 2, 0, -1, 300, &comm);
  EXPECT_EQ(r.kind, CommResult::kTimeout) << r.message;
  EXPECT_LT(Seconds(start), 10.0);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(fake_nccl::Live(), 0);
  EXPECT_EQ(CurrentDevice(), 0);
}

TEST_F(NcclCommEmulatedTest, BadArgumentsAreInvalid) {
  std::string id;
  ASSERT_TRUE(NewUniqueId(&id).ok());
  std::unique_ptr<Comm> comm;
  EXPECT_EQ(Comm::Create(id, 1, 1, -1, 1000, &comm).kind, CommResult::kInvalid);
  EXPECT_EQ(Comm::Create(id, 1, 0, -2, 1000, &comm).kind, CommResult::kInvalid);
  EXPECT_EQ(Comm::Create("short", 1, 0, -1, 1000, &comm).kind,
            CommResult::kInvalid);
  EXPECT_EQ(Comm::Create(id, 1, 0, 5, 1000, &comm).kind,
            CommResult::kUnavailable);  // no device 5
  EXPECT_EQ(CurrentDevice(), 0);
}

// A round of one rank over the real transport: the outcome, a stale
// answer's view in its own broadcast, comes back whole; a view longer than
// world_size is refused before anything is sent.
TEST_F(NcclCommEmulatedTest, ANodeRoundCarriesAStaleAnswersView) {
  std::unique_ptr<Comm> comm = Make(0);
  ASSERT_NE(comm, nullptr);
  NodeRound round(comm.get());
  RoundEntry e;
  e.layer = 2;
  e.step = 6;
  e.count = 4;
  e.channels = 2;
  e.world_size = 3;
  const std::vector<double> values = {0.5, -1.5, 2.0, 3.0};
  Gathered got;
  CommResult r = round.Gather(e, values.data(), &got);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(got.values, values);
  Outcome out;
  out.count = 40;
  out.version = 3;
  out.payload = {1.25, -7.5, 0.125, 9.0};
  out.mask = {0x00};
  out.view = {{0, 6}, {1, 4}, {2, 5}};
  const Outcome sent = out;
  r = round.Share(/*leader=*/true, &out);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(out.view, sent.view);
  EXPECT_EQ(out.payload, sent.payload);
  EXPECT_EQ(out.version, sent.version);
  ASSERT_TRUE(round.Gather(e, values.data(), &got).ok());
  out.view.push_back({3, 6});  // four entries for three ranks
  r = round.Share(/*leader=*/true, &out);
  EXPECT_EQ(r.kind, CommResult::kInvalid) << r.message;
  EXPECT_FALSE(comm->aborted());
}

}  // namespace
}  // namespace syncnorm::nccl
