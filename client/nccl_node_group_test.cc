// NcclNodeGroup: the id handout everywhere; the rounds with one rank per
// visible GPU (threads of this process), skipped without a GPU (the tests
// of several ranks need as many GPUs). Built with SYNCNORM_NCCL_FAKE_COMM
// (//client:nccl_node_group_fake_comm_test), the rounds run on three local
// ranks over the in-process fake communicator.
#include "client/nccl_node_group.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
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
  ASSERT_TRUE(
      FileUniqueIdExchange(path, "old").Publish(std::string(128, 'a')).ok());
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

// The layer whose every answer FakeUpstream gives as a stale one.
constexpr int kStaleLayer = 9;

// A stale-synchronous answer's view at `step`: every rank of the job, the
// last one first lagging by two steps and each other by one.
std::vector<ForwardReply::ViewEntry> StaleView(int64_t step) {
  std::vector<ForwardReply::ViewEntry> view;
  for (int r = 0; r < kWorldSize; ++r) {
    view.push_back({r, step - (r == kWorldSize - 1 ? 2 : r % 2)});
  }
  return view;
}

// Stands in for the aggregator: finalizes the node's moments and returns
// the node's sums. Step 7 is a quorum round without ranks 2, 9 and 11 (both
// bytes of the mask), step 8 counts every rank, step 6 names a rank
// outside the job, step 4 (and every step of kStaleLayer) is a
// stale-synchronous answer (a view, and a version that lags), and step 3
// a view that names a rank outside the job. A backward answer adds 1000
// times its backward index to each sum_dy_xmu, so that a test sees which
// index reached the aggregator.
class FakeUpstream : public NodeGroup {
 public:
  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override {
    if (step == 5) absl::SleepFor(absl::Milliseconds(2500));  // a slow round
    ForwardReply r;
    r.global = Finalize(local);
    r.version = step + 1;
    if (step == 7) r.missing_ranks = {2, 9, 11};
    if (step == 6) r.missing_ranks = {kWorldSize};
    if (step == 4 || layer == kStaleLayer) {
      r.view = StaleView(step);
      r.version = step - 2;
    }
    if (step == 3) r.view = {{0, 3}, {kWorldSize, 3}};
    return r;
  }
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& local) override {
    if (step == 99) return absl::DeadlineExceededError("rank 5 missing");
    GradSums answer = local;
    for (double& v : answer.sum_dy_xmu) v += 1000.0 * backward;
    return answer;
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
      outside(gpus), stale(gpus), bad_view(gpus), after_stale(gpus);
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
          options, exchange,
          r == 0 ? std::make_unique<FakeUpstream>() : nullptr);
      if (!group.ok()) {
        forward[r] = group.status();
        return;
      }
      forward[r] = (*group)->SyncForward(3, 7, LocalOf(r, kChannels));
      GradSums g;
      g.sum_dy.assign(kChannels, 1.0 + r);
      g.sum_dy_xmu.assign(kChannels, -2.0 * r);
      backward[r] = (*group)->SyncBackward(3, 7, 0, g);
      failed[r] = (*group)->SyncBackward(3, 99, 0, g);
      all_in[r] = (*group)->SyncForward(3, 8, LocalOf(r, kChannels));
      outside[r] = (*group)->SyncForward(3, 6, LocalOf(r, kChannels));
      stale[r] = (*group)->SyncForward(3, 4, LocalOf(r, kChannels));
      bad_view[r] = (*group)->SyncForward(3, 3, LocalOf(r, kChannels));
      after_stale[r] = (*group)->SyncForward(3, 8, LocalOf(r, kChannels));
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
    // A stale answer reaches every rank whole: its view, its (lagging)
    // version and the moments' bits.
    ASSERT_TRUE(stale[r].ok()) << "rank " << r << ": " << stale[r].status();
    EXPECT_EQ(stale[r]->view, StaleView(4)) << "rank " << r;
    EXPECT_EQ(stale[r]->version, 2) << "rank " << r;
    EXPECT_EQ(stale[r]->global.count, global.count);
    EXPECT_EQ(stale[r]->global.mean, global.mean) << "bitwise, rank " << r;
    EXPECT_EQ(stale[r]->global.var, global.var) << "bitwise, rank " << r;
    EXPECT_THAT(stale[r]->missing_ranks, IsEmpty()) << "rank " << r;
    // A view naming a rank the job does not have fails on every rank.
    EXPECT_EQ(bad_view[r].status().code(), absl::StatusCode::kInternal)
        << bad_view[r].status();
    EXPECT_THAT(bad_view[r].status().message(), HasSubstr("view names rank 12"))
        << "rank " << r;
    // The next synchronous answer has no view again.
    ASSERT_TRUE(after_stale[r].ok()) << after_stale[r].status();
    EXPECT_THAT(after_stale[r]->view, IsEmpty()) << "rank " << r;
    EXPECT_EQ(after_stale[r]->version, 9);
  }
}

// n local ranks of one node (threads), each with `options` adjusted by
// adjust(rank, options), run body(rank, group) in parallel. Skips (returns
// false) where fewer than n ranks can run.
bool RunNode(int n,
             const std::function<void(int, NcclNodeGroupOptions&)>& adjust,
             const std::function<void(int, NcclNodeGroup&)>& body) {
  std::string why;
  if (LocalRanks(&why) < n) {
    std::printf("SKIPPED: %d local ranks need as many GPUs (%s)\n", n,
                why.c_str());
    return false;
  }
  static int node = 0;
  const std::string session = absl::StrCat("node-", ::getpid(), "-", ++node);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      FileUniqueIdExchange exchange(TempPath(session), session);
      NcclNodeGroupOptions options;
      options.local_rank = r;
      options.local_size = n;
      options.world_size = kWorldSize;
      options.timeout = absl::Seconds(10);
      adjust(r, options);
      auto group = NcclNodeGroup::Create(
          options, exchange,
          r == 0 ? std::make_unique<FakeUpstream>() : nullptr);
      ASSERT_TRUE(group.ok()) << group.status();
      body(r, **group);
    });
  }
  for (std::thread& t : threads) t.join();
  return true;
}

void NoAdjustment(int, NcclNodeGroupOptions&) {}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// One worker's layer over the node: 3 channels, CPU tensors of N x 3.
struct LayerWorker {
  explicit LayerWorker(NodeGroup* group, int layer_id = 0)
      : layer(layer_id, Options(), group, nullptr) {}
  static SyncBatchNormOptions Options() {
    SyncBatchNormOptions o;
    o.num_features = 3;
    return o;
  }
  SyncBatchNorm layer;
  std::vector<float> x = {1, 2, 3, 4, 5, 7, -1, 0, 2, 3, 3, 3};
  std::vector<float> y = std::vector<float>(12, 0.0f);
  std::vector<float> dy = {1, -1, 0.5, 2, 0, 1, 1, 1, 1, -3, 2, 0};
  std::vector<float> gx = std::vector<float>(12, 0.0f);
  TensorRef Ref(std::vector<float>& v, int64_t channels = 3) {
    return TensorRef{v.data(),
                     {static_cast<int64_t>(v.size()) / channels, channels}};
  }
};

// A worker whose input is bad fails the round on every local rank at once,
// with its error: the others do not wait for it until their timeout.
TEST(NcclNodeGroupTest, ALocalFailureFailsEveryRankAtOnce) {
  constexpr int kRanks = 3;
  std::vector<absl::Status> forward(kRanks), backward(kRanks);
  std::vector<double> seconds(kRanks);
  if (!RunNode(kRanks, NoAdjustment, [&](int r, NcclNodeGroup& group) {
        LayerWorker w(&group);
        const auto start = std::chrono::steady_clock::now();
        // Rank 1 passes 4 channels to a layer of 3.
        forward[r] = r == 1 ? w.layer.Forward(w.Ref(w.x, 4), w.Ref(w.y, 4))
                            : w.layer.Forward(w.Ref(w.x), w.Ref(w.y));
        seconds[r] = SecondsSince(start);
        // Then a good forward, and rank 2's backward gets a bad dy.
        if (!w.layer.Forward(w.Ref(w.x), w.Ref(w.y)).ok()) return;
        backward[r] = r == 2 ? w.layer.Backward(w.Ref(w.dy, 4), w.Ref(w.gx, 4))
                             : w.layer.Backward(w.Ref(w.dy), w.Ref(w.gx));
      })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(forward[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << forward[r];
    EXPECT_LT(seconds[r], 5.0) << "rank " << r << " waited for its timeout";
    EXPECT_EQ(backward[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << backward[r];
    if (r != 1) {
      EXPECT_THAT(forward[r].message(),
                  HasSubstr("local rank 1 of this node failed the forward "
                            "round of layer 0 step 0"));
    }
    if (r != 2) {
      EXPECT_THAT(backward[r].message(),
                  HasSubstr("local rank 2 of this node failed the backward"));
    }
  }
}

// Every local rank's layer treats a stale answer as the leader's does: the
// same view and version, running statistics left as they were and flagged
// as behind, the same normalized output bits; and the backward that
// follows works as in a synchronous job.
TEST(NcclNodeGroupTest, EveryLocalLayerTreatsAStaleAnswerAlike) {
  constexpr int kRanks = 3;
  std::vector<std::vector<ForwardReply::ViewEntry>> views(kRanks);
  std::vector<int64_t> versions(kRanks);
  std::vector<int> behind(kRanks);  // not vector<bool>: one per thread
  std::vector<RunningStats> before(kRanks), after(kRanks);
  std::vector<std::vector<float>> y(kRanks), gx(kRanks);
  std::vector<absl::Status> forward(kRanks), backward(kRanks);
  if (!RunNode(kRanks, NoAdjustment, [&](int r, NcclNodeGroup& group) {
        LayerWorker w(&group, kStaleLayer);  // the same batch on every rank
        before[r] = w.layer.running_stats();
        forward[r] = w.layer.Forward(w.Ref(w.x), w.Ref(w.y));
        if (!forward[r].ok()) return;
        backward[r] = w.layer.Backward(w.Ref(w.dy), w.Ref(w.gx));
        views[r] = w.layer.last_view();
        versions[r] = w.layer.last_version();
        behind[r] = w.layer.running_stats_behind();
        after[r] = w.layer.running_stats();
        y[r] = w.y;
        gx[r] = w.gx;
      })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(forward[r].ok()) << "rank " << r << ": " << forward[r];
    EXPECT_TRUE(backward[r].ok()) << "rank " << r << ": " << backward[r];
    EXPECT_EQ(views[r], StaleView(0)) << "rank " << r;
    EXPECT_EQ(versions[r], -2) << "rank " << r;
    EXPECT_TRUE(behind[r]) << "rank " << r << " mirrored a stale answer";
    EXPECT_EQ(after[r].num_batches_tracked, before[r].num_batches_tracked);
    EXPECT_EQ(after[r].mean, before[r].mean) << "rank " << r;
    EXPECT_EQ(after[r].var, before[r].var) << "rank " << r;
    // Equal batches normalized with the same statistics' bits.
    EXPECT_EQ(y[r], y[0]) << "bitwise, rank " << r;
    EXPECT_EQ(gx[r], gx[0]) << "bitwise, rank " << r;
  }
}

// Local ranks that disagree on the channel count or the job's world_size
// fail the round on every rank with INVALID_ARGUMENT (no collective of
// mismatched size is issued), and the next good round works.
TEST(NcclNodeGroupTest, MismatchedChannelsOrWorldSizeAreInvalidOnEveryRank) {
  constexpr int kRanks = 3;
  std::vector<absl::StatusOr<ForwardReply>> channels(kRanks), world(kRanks),
      after(kRanks);
  if (!RunNode(
          kRanks,
          [](int r, NcclNodeGroupOptions& o) {
            if (r == 2) o.world_size = kWorldSize + 1;
          },
          [&](int r, NcclNodeGroup& group) {
            // world_size differs (rank 2) and so do the channels (rank 1).
            channels[r] = group.SyncForward(3, 0, LocalOf(r, r == 1 ? 6 : 5));
            world[r] = group.SyncForward(3, 0, LocalOf(r, 5));
          })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(channels[r].status().code(), absl::StatusCode::kInvalidArgument)
        << channels[r].status();
    EXPECT_THAT(channels[r].status().message(),
                HasSubstr("local rank 1 is at forward layer 3 step 0 with 6 "
                          "channels"));
    EXPECT_EQ(world[r].status().code(), absl::StatusCode::kInvalidArgument)
        << world[r].status();
    EXPECT_THAT(world[r].status().message(),
                HasSubstr("world_size 13, local rank 0 at forward layer 3 "
                          "step 0 with 5 channels and world_size 12"));
  }
  // The communicator is intact: a node whose ranks agree goes on.
  if (!RunNode(kRanks, NoAdjustment, [&](int r, NcclNodeGroup& group) {
        EXPECT_TRUE(group.SyncForward(3, 0, LocalOf(r, 6)).ok());
        after[r] = group.SyncForward(3, 1, LocalOf(r, 5));
      })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r)
    EXPECT_TRUE(after[r].ok()) << after[r].status();
}

// The leader's round upstream (2.5 s at step 5) takes longer than the
// communicator's timeout (1 s); the other ranks wait for it as long as the
// leader's upstream budget allows, and time out (not hang) without one.
TEST(NcclNodeGroupTest, OtherRanksWaitForTheLeadersUpstreamBudget) {
  constexpr int kRanks = 3;
  for (const bool budget : {true, false}) {
    std::vector<absl::StatusOr<ForwardReply>> slow(kRanks);
    if (!RunNode(
            kRanks,
            [budget](int, NcclNodeGroupOptions& o) {
              o.timeout = absl::Seconds(1);
              o.upstream_timeout =
                  budget ? absl::Seconds(10) : absl::ZeroDuration();
            },
            [&](int r, NcclNodeGroup& group) {
              slow[r] = group.SyncForward(3, 5, LocalOf(r, 5));
            })) {
      GTEST_SKIP();
    }
    for (int r = 1; r < kRanks; ++r) {
      if (budget) {
        EXPECT_TRUE(slow[r].ok()) << "rank " << r << ": " << slow[r].status();
      } else {
        EXPECT_EQ(slow[r].status().code(), absl::StatusCode::kDeadlineExceeded)
            << slow[r].status();
      }
    }
  }
}

// Backward sums are added on the host in local-rank order, as ThreadNode
// adds them, whatever order a collective would sum in: 1 + 1e16 - 1e16 is
// 0 in rank order and 1 in reverse.
TEST(NcclNodeGroupTest, BackwardSumsAreAddedInLocalRankOrder) {
  constexpr int kRanks = 3;
  const double values[kRanks] = {1.0, 1e16, -1e16};
  GradSums expected;
  expected.sum_dy.assign(2, 0.0);
  expected.sum_dy_xmu.assign(2, 0.0);
  for (int r = 0; r < kRanks; ++r) {
    GradSums part;
    part.sum_dy.assign(2, values[r]);
    part.sum_dy_xmu.assign(2, -values[r]);
    AddGradSums(expected, part);
  }
  ASSERT_EQ(expected.sum_dy[0], 0.0);
  std::vector<absl::StatusOr<GradSums>> got(kRanks);
  if (!RunNode(kRanks, NoAdjustment, [&](int r, NcclNodeGroup& group) {
        GradSums g;
        g.sum_dy.assign(2, values[r]);
        g.sum_dy_xmu.assign(2, -values[r]);
        got[r] = group.SyncBackward(1, 2, 0, g);
      })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ(got[r]->sum_dy, expected.sum_dy) << "bitwise, rank " << r;
    EXPECT_EQ(got[r]->sum_dy_xmu, expected.sum_dy_xmu) << "rank " << r;
  }
}

// Backwards through one forward are rounds of their own: each index sums
// that index's sums of every rank and reaches the aggregator with it;
// ranks at different indices of one step are not in the same round.
TEST(NcclNodeGroupTest, BackwardsThroughOneForwardAreSeparateRounds) {
  constexpr int kRanks = 3;
  constexpr int kBackwards = 2;
  // Rank r's sums of backward b.
  auto part = [](int r, int b) {
    GradSums g;
    g.sum_dy.assign(2, 1.0 + r + 10.0 * b);
    g.sum_dy_xmu.assign(2, -(r + 1.0) * (b + 1));
    return g;
  };
  // Plain addition over the ranks, plus FakeUpstream's 1000 x index.
  std::vector<double> want_dy(kBackwards, 0.0), want_xmu(kBackwards);
  for (int b = 0; b < kBackwards; ++b) {
    want_xmu[b] = 1000.0 * b;
    for (int r = 0; r < kRanks; ++r) {
      want_dy[b] += 1.0 + r + 10.0 * b;
      want_xmu[b] += -(r + 1.0) * (b + 1);
    }
  }
  std::vector<std::vector<absl::StatusOr<GradSums>>> got(
      kBackwards, std::vector<absl::StatusOr<GradSums>>(kRanks));
  std::vector<absl::StatusOr<GradSums>> apart(kRanks);
  if (!RunNode(kRanks, NoAdjustment, [&](int r, NcclNodeGroup& group) {
        for (int b = 0; b < kBackwards; ++b) {
          got[b][r] = group.SyncBackward(4, 2, b, part(r, b));
        }
        // Rank 1 is one backward ahead of the others.
        const int b = r == 1 ? 1 : 0;
        apart[r] = group.SyncBackward(4, 3, b, part(r, b));
      })) {
    GTEST_SKIP();
  }
  for (int r = 0; r < kRanks; ++r) {
    for (int b = 0; b < kBackwards; ++b) {
      SCOPED_TRACE(testing::Message() << "backward " << b << " rank " << r);
      ASSERT_TRUE(got[b][r].ok()) << got[b][r].status();
      EXPECT_THAT(got[b][r]->sum_dy, ElementsAre(want_dy[b], want_dy[b]));
      EXPECT_THAT(got[b][r]->sum_dy_xmu, ElementsAre(want_xmu[b], want_xmu[b]));
    }
    EXPECT_EQ(apart[r].status().code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << apart[r].status();
    EXPECT_THAT(apart[r].status().message(),
                HasSubstr("local rank 1 is at backward layer 4 step 3 "
                          "backward 1 with 2 channels"));
  }
}

}  // namespace
}  // namespace syncnorm
