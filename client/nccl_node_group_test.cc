// NcclNodeGroup: the id handout everywhere; the rounds with one rank per
// visible GPU (threads of this process), skipped without a GPU. Built with
// SYNCNORM_NCCL_FAKE_COMM (//client:nccl_node_group_fake_comm_test), the
// rounds run on three local ranks over the in-process fake communicator.
#include "client/nccl_node_group.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm_cuda.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The job's world size in these tests: the missing-ranks mask spans two
// bytes.
constexpr int kWorldSize = 12;

// How many local ranks the round tests run: one per visible GPU over NCCL
// (0: skip, `why` says why), three over the fake communicator.
int LocalRanks(std::string* why) {
#ifdef SYNCNORM_NCCL_FAKE_COMM
  return 3;
#else
  return cuda::VisibleDevices(why);
#endif
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(FileUniqueIdExchangeTest, PublishedIdIsFetched) {
  const std::string path = TempPath("id_roundtrip");
  FileUniqueIdExchange leader(path, "session-1"), other(path, "session-1");
  const std::string id(128, '\x5a');
  ASSERT_TRUE(leader.Publish(id).ok());
  absl::StatusOr<std::string> got = other.Fetch(absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, id);
}

TEST(FileUniqueIdExchangeTest, StaleSessionTimesOutClearly) {
  const std::string path = TempPath("id_stale");
  ASSERT_TRUE(FileUniqueIdExchange(path, "old").Publish(std::string(128, 'a'))
                  .ok());
  absl::StatusOr<std::string> got =
      FileUniqueIdExchange(path, "new").Fetch(absl::Milliseconds(50));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("local rank 0"), std::string::npos);
}

TEST(NcclNodeGroupTest, LeaderWithoutUpstreamIsInvalid) {
  FileUniqueIdExchange exchange(TempPath("id_invalid"), "s");
  NcclNodeGroupOptions options;
  options.world_size = kWorldSize;
  absl::StatusOr<std::unique_ptr<NcclNodeGroup>> g =
      NcclNodeGroup::Create(options, exchange, nullptr);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclNodeGroupTest, MissingWorldSizeIsInvalid) {
  FileUniqueIdExchange exchange(TempPath("id_no_world"), "s");
  NcclNodeGroupOptions options;  // world_size unset
  absl::StatusOr<std::unique_ptr<NcclNodeGroup>> g =
      NcclNodeGroup::Create(options, exchange, nullptr);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("world_size"));
}

// Stands in for the aggregator: finalizes the node's moments and returns
// the node's sums. Step 7 is a quorum round without ranks 2, 9 and 11 (both
// bytes of the mask), step 8 counts every rank, and step 6 names a rank
// outside the job.
class FakeUpstream : public NodeGroup {
 public:
  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override {
    ForwardReply r;
    r.global = Finalize(local);
    r.version = step + 1;
    if (step == 7) r.missing_ranks = {2, 9, 11};
    if (step == 6) r.missing_ranks = {kWorldSize};
    return r;
  }
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step,
                                        const GradSums& local) override {
    if (step == 99) return absl::DeadlineExceededError("rank 5 missing");
    return local;
  }
};

Moments LocalOf(int rank, int channels) {
  Moments m = Moments::Zero(channels);
  m.count = rank == 1 ? 0 : 10 + rank;  // rank 1: an empty batch
  for (int c = 0; c < channels && m.count > 0; ++c) {
    m.mean[c] = 0.5 * rank - c;
    m.m2[c] = 1.0 + rank + c;
  }
  return m;
}

TEST(NcclNodeGroupTest, RoundsOverEveryVisibleGpu) {
  std::string why;
  const int gpus = LocalRanks(&why);
  if (gpus == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", why.c_str());
    GTEST_SKIP() << why;
  }
  constexpr int kChannels = 5;
  const std::string session = absl::StrCat("test-", ::getpid());
  Moments expected = Moments::Zero(kChannels);
  for (int r = 0; r < gpus; ++r) MergeMoments(expected, LocalOf(r, kChannels));
  const GlobalMoments global = Finalize(expected);
  std::vector<absl::StatusOr<ForwardReply>> forward(gpus), all_in(gpus),
      outside(gpus);
  std::vector<absl::StatusOr<GradSums>> backward(gpus), failed(gpus);
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r) {
    threads.emplace_back([&, r] {
      FileUniqueIdExchange exchange(TempPath("id_rounds"), session);
      NcclNodeGroupOptions options;
      options.local_rank = r;
      options.local_size = gpus;
      options.world_size = kWorldSize;
      options.timeout = absl::Seconds(60);
      auto group = NcclNodeGroup::Create(
          options, exchange, r == 0 ? std::make_unique<FakeUpstream>() : nullptr);
      if (!group.ok()) {
        forward[r] = group.status();
        return;
      }
      forward[r] = (*group)->SyncForward(3, 7, LocalOf(r, kChannels));
      GradSums g;
      g.sum_dy.assign(kChannels, 1.0 + r);
      g.sum_dy_xmu.assign(kChannels, -2.0 * r);
      backward[r] = (*group)->SyncBackward(3, 7, g);
      failed[r] = (*group)->SyncBackward(3, 99, g);
      all_in[r] = (*group)->SyncForward(3, 8, LocalOf(r, kChannels));
      outside[r] = (*group)->SyncForward(3, 6, LocalOf(r, kChannels));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < gpus; ++r) {
    ASSERT_TRUE(forward[r].ok()) << "rank " << r << ": " << forward[r].status();
    EXPECT_EQ(forward[r]->global.count, global.count);
    EXPECT_EQ(forward[r]->global.mean, global.mean) << "bitwise, rank " << r;
    EXPECT_EQ(forward[r]->global.var, global.var) << "bitwise, rank " << r;
    EXPECT_EQ(forward[r]->version, 8);
    EXPECT_THAT(forward[r]->missing_ranks, ElementsAre(2, 9, 11))
        << "rank " << r;
    ASSERT_TRUE(backward[r].ok()) << backward[r].status();
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_DOUBLE_EQ(backward[r]->sum_dy[c], gpus + gpus * (gpus - 1) / 2.0);
      EXPECT_DOUBLE_EQ(backward[r]->sum_dy_xmu[c], -1.0 * gpus * (gpus - 1));
    }
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(all_in[r].ok()) << all_in[r].status();
    EXPECT_THAT(all_in[r]->missing_ranks, IsEmpty()) << "rank " << r;
    EXPECT_EQ(all_in[r]->version, 9);
    // A rank the job does not have: the leader fails the round for all.
    EXPECT_EQ(outside[r].status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(outside[r].status().message(), HasSubstr("rank 12"));
  }
}

}  // namespace
}  // namespace syncnorm
