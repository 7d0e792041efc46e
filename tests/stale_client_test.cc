// Stale-synchronous jobs (staleness tau > 0) seen through the C++ client and
// SyncBatchNorm, on the real aggregator binary. Three ranks, each a worker
// alone on its node (its own thread and Reduce stream), train one layer
// forward and backward for kSteps steps; rank 2 sleeps before each step.
// Every forward answer must normalize with the float64 Chan merge of
// exactly the contributions its view names (recomputed here from the
// ranks' inputs), every view entry must lie within [s - tau, s] and, from
// step tau on, name every member (the clock condition), and the running
// statistics that each rank loads after training (AwaitRunningStats) must
// equal, bit for bit, those of a synchronous job that trained on the same data.
// A second test makes rank 0 an NCCL node of two local ranks (on the
// in-process fake communicator): both must see the same answers.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/layer_spec.h"
#include "client/nccl_node_group.h"
#include "client/running_stats.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "tests/testing/aggregator_suite.h"
#include "tests/testing/cluster.h"

namespace syncnorm::testing {
namespace {

constexpr int kWorldSize = 3;
constexpr int kSlowRank = 2;
constexpr int kChannels = 3;
constexpr int64_t kSpatial = 2;
constexpr int kSteps = 8;
constexpr int kStaleness = 2;
constexpr auto kSlowSleep = std::chrono::milliseconds(40);

// Rank r's input at step s: (3 + r) rows of kChannels x kSpatial; the
// same in every job.
std::vector<float> Input(int rank, int step) {
  std::mt19937_64 rng(1000 * rank + step);
  std::normal_distribution<float> normal(1.0f + rank, 1.5f + 0.25f * step);
  std::vector<float> x((3 + rank) * kChannels * kSpatial);
  for (float& v : x) v = normal(rng);
  return x;
}

// float64 count, mean and M2 of one rank's input per channel, two-pass.
struct Ref {
  double n = 0;
  std::vector<double> mean, m2;
};

Ref LocalRef(const std::vector<float>& x) {
  Ref r;
  const int64_t rows = static_cast<int64_t>(x.size()) / (kChannels * kSpatial);
  r.n = static_cast<double>(rows * kSpatial);
  r.mean.assign(kChannels, 0.0);
  r.m2.assign(kChannels, 0.0);
  for (int c = 0; c < kChannels; ++c) {
    double sum = 0;
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t s = 0; s < kSpatial; ++s) {
        sum += x[(b * kChannels + c) * kSpatial + s];
      }
    }
    r.mean[c] = sum / r.n;
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t s = 0; s < kSpatial; ++s) {
        const double d = x[(b * kChannels + c) * kSpatial + s] - r.mean[c];
        r.m2[c] += d * d;
      }
    }
  }
  return r;
}

// Chan's merge of b into a, in float64.
void MergeRef(Ref& a, const Ref& b) {
  if (b.n == 0) return;
  if (a.n == 0) {
    a = b;
    return;
  }
  const double n = a.n + b.n;
  for (int c = 0; c < kChannels; ++c) {
    const double delta = b.mean[c] - a.mean[c];
    a.m2[c] += b.m2[c] + delta * delta * a.n * b.n / n;
    a.mean[c] += delta * b.n / n;
  }
  a.n = n;
}

// What one rank saw at one step.
struct Answer {
  std::vector<ForwardReply::ViewEntry> view;
  int64_t version = 0;
  std::vector<float> y;
};

struct RankRun {
  std::vector<Answer> answers;  // by step
  bool behind_after_training = false;
  RunningStats loaded;  // after AwaitRunningStats
};

class StaleClientTest : public AggregatorSuite<StaleClientTest> {
 public:
  static constexpr char kScratchName[] = "stale-client";
  static std::vector<std::string> AggregatorFlags() {
    return {"--round_timeout_ms=20000"};
  }

 protected:
  StaleClientTest() : client_(Options()) { options_.num_features = kChannels; }

  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(20);
    o.round_timeout = absl::Seconds(30);
    return o;
  }

  void CreateJob(const std::string& job_id, int staleness) {
    v1::CreateJobRequest job;
    job.set_job_id(job_id);
    job.set_world_size(kWorldSize);
    job.set_round_timeout_ms(20000);
    job.set_staleness(staleness);
    auto spec = ToLayerSpec(options_, "bn");
    ASSERT_TRUE(spec.ok()) << spec.status();
    *job.add_layers() = *spec;
    auto info = client_.CreateJob(job);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->staleness(), staleness);
  }

  // Every rank on a thread of its own: kSteps forward + backward steps,
  // the slow rank sleeping before each; then AwaitRunningStats.
  std::vector<RankRun> Train(const std::string& job_id, bool slow) {
    std::vector<RankRun> runs(kWorldSize);
    std::vector<absl::Status> status(kWorldSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorldSize; ++r) {
      threads.emplace_back([&, r] {
        status[r] = TrainRank(job_id, r, slow && r == kSlowRank, runs[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorldSize; ++r) {
      EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    }
    return runs;
  }

  absl::Status TrainRank(const std::string& job_id, int rank, bool slow,
                         RankRun& run) {
    std::unique_ptr<NodeGroup> group = client_.NewNodeGroup(job_id, rank);
    return TrainOn(group.get(), job_id, rank, slow, run);
  }

  // One worker of `rank` through `group`, on rank's inputs.
  absl::Status TrainOn(NodeGroup* group, const std::string& job_id, int rank,
                       bool slow, RankRun& run) {
    SyncBatchNorm layer(0, options_, group, nullptr);
    for (int step = 0; step < kSteps; ++step) {
      if (slow) std::this_thread::sleep_for(kSlowSleep);
      std::vector<float> x = Input(rank, step);
      const std::vector<int64_t> shape = {
          static_cast<int64_t>(x.size()) / (kChannels * kSpatial), kChannels,
          kSpatial};
      Answer a;
      a.y.resize(x.size());
      absl::Status s = layer.Forward(TensorRef{x.data(), shape},
                                     TensorRef{a.y.data(), shape});
      if (!s.ok()) return s;
      a.view = layer.last_view();
      a.version = layer.last_version();
      std::vector<float> dy(x.size(), 0.5f), dx(x.size());
      s = layer.Backward(TensorRef{dy.data(), shape},
                         TensorRef{dx.data(), shape});
      if (!s.ok()) return s;
      run.answers.push_back(std::move(a));
    }
    run.behind_after_training = layer.running_stats_behind();
    SyncBatchNorm* layers[] = {&layer};
    if (absl::Status s = AwaitRunningStats(client_, job_id, 0, layers);
        !s.ok()) {
      return s;
    }
    if (layer.running_stats_behind()) {
      return absl::InternalError("still behind after AwaitRunningStats");
    }
    run.loaded = layer.running_stats();
    return absl::OkStatus();
  }

  RunningStats ServerStats(const std::string& job_id) {
    v1::GetRunningStatsRequest request;
    request.set_job_id(job_id);
    auto stats = client_.GetRunningStats(request);
    EXPECT_TRUE(stats.ok()) << stats.status();
    RunningStats out;
    if (!stats.ok() || stats->layers_size() != 1) return out;
    const v1::LayerStats& l = stats->layers(0);
    out.num_batches_tracked = l.num_batches_tracked();
    out.mean.assign(l.running_mean().begin(), l.running_mean().end());
    out.var.assign(l.running_var().begin(), l.running_var().end());
    return out;
  }

  Client client_;
  SyncBatchNormOptions options_;
};

void ExpectSameStats(const RunningStats& got, const RunningStats& want,
                     const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.num_batches_tracked, want.num_batches_tracked);
  ASSERT_EQ(got.mean.size(), want.mean.size());
  ASSERT_EQ(got.var.size(), want.var.size());
  for (size_t c = 0; c < got.mean.size(); ++c) {
    EXPECT_EQ(got.mean[c], want.mean[c]) << "mean, channel " << c;
    EXPECT_EQ(got.var[c], want.var[c]) << "var, channel " << c;
  }
}

TEST_F(StaleClientTest, AnswersMergeTheirViewAndStatisticsEqualASyncRun) {
  CreateJob("sync", 0);
  const std::vector<RankRun> sync = Train("sync", /*slow=*/false);
  CreateJob("stale", kStaleness);
  const std::vector<RankRun> stale = Train("stale", /*slow=*/true);
  ASSERT_FALSE(HasFailure());

  const RunningStats want = ServerStats("sync");
  ASSERT_EQ(want.num_batches_tracked, kSteps);
  for (int r = 0; r < kWorldSize; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    // A synchronous job: no views, the local mirror is the server's.
    EXPECT_FALSE(sync[r].behind_after_training);
    for (const Answer& a : sync[r].answers) EXPECT_TRUE(a.view.empty());
    ExpectSameStats(sync[r].loaded, want, "sync job, loaded");
    // The stale job's layer does not mirror, and loads the server's.
    EXPECT_TRUE(stale[r].behind_after_training);
    ExpectSameStats(stale[r].loaded, want, "stale job, loaded");
  }
  ExpectSameStats(ServerStats("stale"), want, "stale job, on the server");

  int ahead = 0;  // answers whose view has a step before its own
  for (int r = 0; r < kWorldSize; ++r) {
    ASSERT_EQ(stale[r].answers.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " step ", s));
      const Answer& a = stale[r].answers[s];
      // Ranks ascending, steps within the bound, the receiver with its own
      // contribution of this step. The clock condition puts every member
      // in it, from step 0 on: a member that has sent nothing yet is
      // waited for.
      EXPECT_EQ(a.view.size(), static_cast<size_t>(kWorldSize));
      Ref merged;
      bool own = false;
      for (size_t i = 0; i < a.view.size(); ++i) {
        if (i > 0) {
          EXPECT_LT(a.view[i - 1].rank, a.view[i].rank);
        }
        EXPECT_GE(a.view[i].step, s - kStaleness);
        EXPECT_LE(a.view[i].step, s);
        own = own || (a.view[i].rank == r && a.view[i].step == s);
        if (a.view[i].step < s ||
            a.view.size() < static_cast<size_t>(kWorldSize))
          ++ahead;
        MergeRef(merged, LocalRef(Input(a.view[i].rank, a.view[i].step)));
      }
      EXPECT_TRUE(own);
      // y = (x - mean) / sqrt(var + eps) with the view's merge (gamma 1,
      // beta 0), in float32.
      const std::vector<float> x = Input(r, s);
      for (size_t k = 0; k < x.size(); ++k) {
        const int c = static_cast<int>((k / kSpatial) % kChannels);
        const double var = merged.m2[c] / merged.n;
        const double want_y = (x[k] - merged.mean[c]) / std::sqrt(var + 1e-5);
        ASSERT_NEAR(a.y[k], want_y, 1e-5 * (1 + std::abs(want_y)))
            << "element " << k;
      }
    }
  }
  // The fast ranks ran ahead of the slow one (the point of the job).
  EXPECT_GT(ahead, 0);
}

// Rank 0 is an NCCL node of two local ranks with the same inputs; ranks 1
// and 2 work alone, rank 2 slowly. The other local rank gets each stale
// answer through the leader's broadcast: the same view, version and output
// bits as the leader, its statistics flagged as behind until it loads the
// server's.
TEST_F(StaleClientTest, EveryLocalRankOfAnNcclNodeGetsTheSameStaleAnswers) {
  const std::string job = "stale-nccl";
  CreateJob(job, kStaleness);
  constexpr int kLocal = 2;
  std::vector<RankRun> runs(kLocal + kWorldSize - 1);  // local 0, 1, rank 1, 2
  std::vector<absl::Status> status(runs.size());
  std::vector<std::thread> threads;
  for (int local = 0; local < kLocal; ++local) {
    threads.emplace_back([&, local] {
      NcclNodeGroupOptions o;
      o.local_rank = local;
      o.local_size = kLocal;
      o.world_size = kWorldSize;
      o.timeout = absl::Seconds(30);
      FileUniqueIdExchange exchange(absl::StrCat(dir(), "/nccl-id-", job), job);
      auto group = NcclNodeGroup::Create(
          o, exchange, local == 0 ? client_.NewNodeGroup(job, 0) : nullptr);
      status[local] = group.status();
      if (group.ok()) {
        status[local] = TrainOn(group->get(), job, 0, false, runs[local]);
      }
    });
  }
  for (int r = 1; r < kWorldSize; ++r) {
    threads.emplace_back([&, r] {
      status[kLocal + r - 1] =
          TrainRank(job, r, r == kSlowRank, runs[kLocal + r - 1]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < status.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << "worker " << i << ": " << status[i];
  }
  const RunningStats server = ServerStats(job);
  ASSERT_EQ(server.num_batches_tracked, kSteps);
  int lagging = 0;  // the node's answers with a view of an earlier step
  for (int local = 0; local < kLocal; ++local) {
    SCOPED_TRACE(absl::StrCat("local rank ", local));
    const RankRun& run = runs[local];
    EXPECT_TRUE(run.behind_after_training);
    ExpectSameStats(run.loaded, server, "loaded");
    ASSERT_EQ(run.answers.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE(absl::StrCat("step ", s));
      const Answer& a = run.answers[s];
      const Answer& leader = runs[0].answers[s];
      EXPECT_FALSE(a.view.empty());
      EXPECT_EQ(a.view, leader.view);
      EXPECT_EQ(a.version, leader.version);
      EXPECT_EQ(a.y, leader.y) << "bitwise";
      for (const ForwardReply::ViewEntry& e : a.view) {
        lagging += local == 0 && e.step < s;
      }
    }
  }
  EXPECT_GT(lagging, 0) << "rank 0 never got a stale answer";
}

}  // namespace
}  // namespace syncnorm::testing
