// Quorum rounds seen through the C++ client: a job of 3 ranks whose rounds
// complete with 2, on the real aggregator binary. Rank 2 does not contribute
// to step 0, so every worker of ranks 0 and 1 (leaders and the other local
// ranks of their nodes) must read exactly [2] from its layer's
// last_missing_ranks(); at step 1 every rank contributes and it is empty.
// Nodes are a ThreadNode, a worker alone (SoloNodeGroup), NcclNodeGroups
// over the in-process fake communicator, and workers of a job spread over
// two aggregator shards (ShardedNodeGroup).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/layer_spec.h"
#include "client/nccl_node_group.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
#include "client/thread_node.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "tests/testing/aggregator_suite.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int kWorldSize = 3;
constexpr int kAbsentRank = 2;
constexpr int kChannels = 3;
constexpr int64_t kSpatial = 2;
// Long enough that the ranks of an all-present round (threads started
// together) always arrive within it.
constexpr int64_t kGraceMs = 2000;

// One worker: its contributor rank, its way to the aggregator, its layer
// and its input (batch rows of kChannels x kSpatial).
struct Worker {
  int rank = 0;
  std::unique_ptr<NodeGroup> group;
  std::unique_ptr<SyncBatchNorm> layer;
  std::vector<float> x;
  int64_t batch = 0;
};

// Runs fn(w) for each index in `which` on a thread of its own; joins them.
void InParallel(const std::vector<int>& which,
                const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int w : which) threads.emplace_back(fn, w);
  for (std::thread& t : threads) t.join();
}

class QuorumClientTest : public AggregatorSuite<QuorumClientTest> {
 public:
  static constexpr char kScratchName[] = "quorum-client";
  static std::vector<std::string> AggregatorFlags() {
    return {"--round_timeout_ms=20000"};
  }

 protected:
  QuorumClientTest() : client_(Options()) {}

  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(10);
    o.round_timeout = absl::Seconds(30);
    return o;
  }

  // Creates the job through `client` (CreateJob: this suite's aggregator,
  // one layer): `layers` layers, rounds complete with 2 of the 3 ranks
  // kGraceMs after their first contribution.
  void CreateJob(const std::string& job_id) { CreateJobOn(client_, job_id, 1); }
  void CreateJobOn(Client& client, const std::string& job_id, int layers) {
    options_.num_features = kChannels;
    v1::CreateJobRequest job;
    job.set_job_id(job_id);
    job.set_world_size(kWorldSize);
    job.set_round_timeout_ms(20000);
    job.mutable_quorum()->set_min_ranks(kWorldSize - 1);
    job.mutable_quorum()->set_grace_ms(kGraceMs);
    for (int l = 0; l < layers; ++l) {
      auto spec = ToLayerSpec(options_, absl::StrCat("bn", l));
      ASSERT_TRUE(spec.ok()) << spec.status();
      *job.add_layers() = *spec;
    }
    auto info = client.CreateJob(job);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  // Gives worker w random input of `batch` rows and its layer (`layer` of
  // the job) on `group` (default: its own).
  void Prepare(Worker& w, int64_t batch, std::mt19937_64& rng, int layer = 0,
               NodeGroup* group = nullptr) {
    std::normal_distribution<float> normal(1.5f, 2.0f);
    w.batch = batch;
    w.x.resize(batch * kChannels * kSpatial);
    for (float& v : w.x) v = normal(rng);
    w.layer = std::make_unique<SyncBatchNorm>(
        layer, options_, group != nullptr ? group : w.group.get(), nullptr);
  }

  // One training forward of worker w at the layer's next step.
  static absl::Status Forward(Worker& w) {
    std::vector<float> y(w.x.size());
    const std::vector<int64_t> shape = {w.batch, kChannels, kSpatial};
    return w.layer->Forward(TensorRef{w.x.data(), shape},
                            TensorRef{y.data(), shape});
  }

  // The running mean the aggregator holds after one round (torch momentum
  // 0.1 from zeros) over the input of the workers of `ranks`.
  std::vector<double> WantRunningMean(const std::vector<Worker>& workers,
                                      const std::vector<int>& ranks) {
    std::vector<double> sum(kChannels, 0.0);
    int64_t n = 0;
    for (const Worker& w : workers) {
      if (std::find(ranks.begin(), ranks.end(), w.rank) == ranks.end()) {
        continue;
      }
      for (int64_t b = 0; b < w.batch; ++b) {
        for (int c = 0; c < kChannels; ++c) {
          for (int64_t s = 0; s < kSpatial; ++s) {
            sum[c] += w.x[(b * kChannels + c) * kSpatial + s];
          }
        }
      }
      n += w.batch * kSpatial;
    }
    for (double& v : sum) v = 0.1 * v / n;
    return sum;
  }

  void ExpectServerRunningMean(const std::string& job_id,
                               const std::vector<double>& want) {
    v1::GetRunningStatsRequest request;
    request.set_job_id(job_id);
    auto stats = client_.GetRunningStats(request);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->layers_size(), 1);
    EXPECT_EQ(stats->layers(0).num_batches_tracked(), 1);
    ASSERT_EQ(stats->layers(0).running_mean_size(), kChannels);
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_NEAR(stats->layers(0).running_mean(c), want[c], 1e-6);
    }
  }

  // Step 0 without rank 2, then step 1 with every rank; each worker's
  // last_missing_ranks() after each. REQUIRES: the workers of rank 2
  // (if any) come last.
  void RunTwoSteps(std::vector<Worker>& workers, const std::string& job_id) {
    std::vector<int> present, all;
    for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
      all.push_back(i);
      if (workers[i].rank != kAbsentRank) present.push_back(i);
    }
    std::vector<absl::Status> status(workers.size());
    InParallel(present, [&](int i) { status[i] = Forward(workers[i]); });
    for (int i : present) {
      SCOPED_TRACE(absl::StrCat("worker ", i, " of rank ", workers[i].rank));
      ASSERT_TRUE(status[i].ok()) << status[i];
      EXPECT_THAT(workers[i].layer->last_missing_ranks(),
                  ElementsAre(kAbsentRank));
    }
    ExpectServerRunningMean(job_id, WantRunningMean(workers, {0, 1}));
    for (Worker& w : workers) {
      if (w.rank == kAbsentRank) w.layer->set_step(1);
    }
    InParallel(all, [&](int i) { status[i] = Forward(workers[i]); });
    for (int i : all) {
      SCOPED_TRACE(absl::StrCat("worker ", i, " of rank ", workers[i].rank));
      ASSERT_TRUE(status[i].ok()) << status[i];
      EXPECT_THAT(workers[i].layer->last_missing_ranks(), IsEmpty());
    }
  }

  Client client_;
  SyncBatchNormOptions options_;
};

// Rank 0: a ThreadNode of two workers; rank 1: a worker alone; rank 2: a
// worker alone that joins at step 1.
TEST_F(QuorumClientTest, ThreadNodeAndSoloWorkersNameTheAbsentRank) {
  const std::string job = "quorum-threads";
  CreateJob(job);
  ThreadNode node(2, client_.NewNodeGroup(job, 0), absl::Seconds(30));
  std::vector<Worker> workers(4);
  workers[0].group = node.Member(0);
  workers[1].group = node.Member(1);
  workers[2].rank = 1;
  workers[2].group = client_.NewNodeGroup(job, 1);
  workers[3].rank = kAbsentRank;
  workers[3].group = client_.NewNodeGroup(job, kAbsentRank);
  std::mt19937_64 rng(41);
  const int64_t batches[] = {3, 0, 4, 2};  // an empty local batch too
  for (int i = 0; i < 4; ++i) Prepare(workers[i], batches[i], rng);
  RunTwoSteps(workers, job);
}

// A rank that contributes after the quorum round completed gets its
// result, naming itself: its contribution was not counted.
TEST_F(QuorumClientTest, LateRankIsNamedInItsOwnResult) {
  const std::string job = "quorum-late";
  CreateJob(job);
  std::vector<Worker> workers(kWorldSize);
  std::mt19937_64 rng(42);
  for (int r = 0; r < kWorldSize; ++r) {
    workers[r].rank = r;
    workers[r].group = client_.NewNodeGroup(job, r);
    Prepare(workers[r], 3, rng);
  }
  std::vector<absl::Status> status(kWorldSize);
  InParallel({0, 1}, [&](int r) { status[r] = Forward(workers[r]); });
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  ASSERT_TRUE(Forward(workers[kAbsentRank]).ok());
  EXPECT_THAT(workers[kAbsentRank].layer->last_missing_ranks(),
              ElementsAre(kAbsentRank));
  ExpectServerRunningMean(job, WantRunningMean(workers, {0, 1}));
}

// Rank 0: an NCCL node of three local ranks; rank 1: one of two; rank 2:
// a worker alone that joins at step 1. The non-leaders get the missing
// ranks through the leader's broadcast.
TEST_F(QuorumClientTest, NcclNodesNameTheAbsentRankOnEveryLocalRank) {
  const std::string job = "quorum-nccl";
  CreateJob(job);
  const int local_sizes[] = {3, 2};
  std::vector<Worker> workers;
  std::vector<NcclNodeGroupOptions> nccl;
  for (int rank = 0; rank < 2; ++rank) {
    for (int local = 0; local < local_sizes[rank]; ++local) {
      NcclNodeGroupOptions o;
      o.local_rank = local;
      o.local_size = local_sizes[rank];
      o.world_size = kWorldSize;
      o.timeout = absl::Seconds(30);
      nccl.push_back(o);
      workers.emplace_back();
      workers.back().rank = rank;
    }
  }
  // Every local rank of a node must be in Create at once.
  std::vector<absl::Status> created(nccl.size());
  std::vector<int> nccl_workers;
  for (int i = 0; i < static_cast<int>(nccl.size()); ++i) {
    nccl_workers.push_back(i);
  }
  InParallel(nccl_workers, [&](int i) {
    const int rank = workers[i].rank;
    FileUniqueIdExchange exchange(
        absl::StrCat(dir(), "/nccl-id-", job, "-", rank), job);
    auto group = NcclNodeGroup::Create(
        nccl[i], exchange,
        nccl[i].local_rank == 0 ? client_.NewNodeGroup(job, rank) : nullptr);
    created[i] = group.status();
    if (group.ok()) workers[i].group = *std::move(group);
  });
  for (const absl::Status& s : created) ASSERT_TRUE(s.ok()) << s;
  workers.emplace_back();
  workers.back().rank = kAbsentRank;
  workers.back().group = client_.NewNodeGroup(job, kAbsentRank);
  std::mt19937_64 rng(43);
  for (Worker& w : workers) Prepare(w, 2 + w.rank, rng);
  RunTwoSteps(workers, job);
}

// A job spread over two aggregator shards: each rank's ShardedNodeGroup
// sends each layer's rounds to the shard holding it, and every layer's
// workers (of ranks 0 and 1, in parallel) name the absent rank.
TEST_F(QuorumClientTest, ShardedNodeGroupNamesTheAbsentRankOnEveryShard) {
  constexpr int kLayers = 4;
  std::vector<std::unique_ptr<AggregatorProcess>> shards;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    auto a = AggregatorProcess::Start(MakeScratchDir(absl::StrCat("shard", i)),
                                      {"--round_timeout_ms=20000"});
    ASSERT_TRUE(a.ok()) << a.status();
    addresses.push_back((*a)->address());
    shards.push_back(*std::move(a));
  }
  ClientOptions o = Options();
  o.address = absl::StrJoin(addresses, ",");
  Client client(o);
  const std::string job = "quorum-sharded";
  CreateJobOn(client, job, kLayers);
  std::vector<int> holders;
  for (int l = 0; l < kLayers; ++l) holders.push_back(client.ShardOf(job, l));
  EXPECT_THAT(holders, ::testing::Contains(0));
  EXPECT_THAT(holders, ::testing::Contains(1));
  std::unique_ptr<NodeGroup> groups[2] = {client.NewNodeGroup(job, 0),
                                          client.NewNodeGroup(job, 1)};
  std::vector<Worker> workers(2 * kLayers);  // (rank, layer)
  std::mt19937_64 rng(44);
  std::vector<int> all;
  for (int i = 0; i < 2 * kLayers; ++i) {
    workers[i].rank = i / kLayers;
    Prepare(workers[i], 3, rng, i % kLayers, groups[i / kLayers].get());
    all.push_back(i);
  }
  std::vector<absl::Status> status(workers.size());
  InParallel(all, [&](int i) { status[i] = Forward(workers[i]); });
  for (int i : all) {
    SCOPED_TRACE(
        absl::StrCat("rank ", workers[i].rank, " layer ", i % kLayers));
    ASSERT_TRUE(status[i].ok()) << status[i];
    EXPECT_THAT(workers[i].layer->last_missing_ranks(),
                ElementsAre(kAbsentRank));
  }
}

}  // namespace
}  // namespace syncnorm::testing
