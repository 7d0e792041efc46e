// NcclNodeGroup: the id handout everywhere; the NCCL rounds with one rank
// per visible GPU (threads of this process), skipped without a GPU.
#include "client/nccl_node_group.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm_cuda.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace {

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
  absl::StatusOr<std::unique_ptr<NcclNodeGroup>> g =
      NcclNodeGroup::Create(options, exchange, nullptr);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
}

// Stands in for the aggregator: finalizes the node's moments and returns
// the node's sums, recording what it got.
class FakeUpstream : public NodeGroup {
 public:
  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override {
    ForwardReply r;
    r.global = Finalize(local);
    r.version = step + 1;
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
  const int gpus = cuda::VisibleDevices(&why);
  if (gpus == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", why.c_str());
    GTEST_SKIP() << why;
  }
  constexpr int kChannels = 5;
  const std::string session = absl::StrCat("test-", ::getpid());
  Moments expected = Moments::Zero(kChannels);
  for (int r = 0; r < gpus; ++r) MergeMoments(expected, LocalOf(r, kChannels));
  const GlobalMoments global = Finalize(expected);
  std::vector<absl::StatusOr<ForwardReply>> forward(gpus);
  std::vector<absl::StatusOr<GradSums>> backward(gpus), failed(gpus);
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r) {
    threads.emplace_back([&, r] {
      FileUniqueIdExchange exchange(TempPath("id_rounds"), session);
      NcclNodeGroupOptions options;
      options.local_rank = r;
      options.local_size = gpus;
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
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < gpus; ++r) {
    ASSERT_TRUE(forward[r].ok()) << "rank " << r << ": " << forward[r].status();
    EXPECT_EQ(forward[r]->global.count, global.count);
    EXPECT_EQ(forward[r]->global.mean, global.mean) << "bitwise, rank " << r;
    EXPECT_EQ(forward[r]->global.var, global.var) << "bitwise, rank " << r;
    EXPECT_EQ(forward[r]->version, 8);
    ASSERT_TRUE(backward[r].ok()) << backward[r].status();
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_DOUBLE_EQ(backward[r]->sum_dy[c], gpus + gpus * (gpus - 1) / 2.0);
      EXPECT_DOUBLE_EQ(backward[r]->sum_dy_xmu[c], -1.0 * gpus * (gpus - 1));
    }
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kDeadlineExceeded);
  }
}

}  // namespace
}  // namespace syncnorm
