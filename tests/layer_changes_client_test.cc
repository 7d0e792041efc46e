// The C++ client and layer on the real aggregator binary: a job whose
// groups are rank lists (torch's new_group([0, 2]) and new_group([1, 3])),
// and changes to a layer after construction (a momentum of the round,
// imported running statistics) reaching the service, every worker's
// mirror equal to the service's statistics bit for bit.
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
#include "client/contributor.h"
#include "client/job_groups.h"
#include "client/layer_spec.h"
#include "client/running_stats.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "tests/testing/aggregator_suite.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

constexpr int kChannels = 3;
constexpr int64_t kSpatial = 4;
constexpr double kEps = 1e-5;

// One worker: its rank, node group, layer and input rows.
struct Worker {
  int rank = 0;
  std::unique_ptr<NodeGroup> group;
  std::unique_ptr<SyncBatchNorm> layer;
  int64_t batch = 0;
  std::vector<float> x, y;
  absl::Status status;
};

void InParallel(std::vector<Worker>& workers,
                const std::function<void(Worker&)>& fn) {
  std::vector<std::thread> threads;
  for (Worker& w : workers) threads.emplace_back([&fn, &w] { fn(w); });
  for (std::thread& t : threads) t.join();
}

absl::Status Forward(Worker& w) {
  w.y.assign(w.x.size(), std::nanf(""));
  const std::vector<int64_t> shape = {w.batch, kChannels, kSpatial};
  return w.layer->Forward(TensorRef{w.x.data(), shape},
                          TensorRef{w.y.data(), shape});
}

// Two-pass long-double mean and biased var of channel c over `workers`.
std::pair<long double, long double> Stats(const std::vector<Worker*>& ws,
                                          int c) {
  long double sum = 0, n = 0;
  for (const Worker* w : ws) {
    for (int64_t b = 0; b < w->batch; ++b) {
      for (int64_t s = 0; s < kSpatial; ++s) {
        sum += w->x[(b * kChannels + c) * kSpatial + s];
        n += 1;
      }
    }
  }
  const long double mean = sum / n;
  long double m2 = 0;
  for (const Worker* w : ws) {
    for (int64_t b = 0; b < w->batch; ++b) {
      for (int64_t s = 0; s < kSpatial; ++s) {
        const long double d = w->x[(b * kChannels + c) * kSpatial + s] - mean;
        m2 += d * d;
      }
    }
  }
  return {mean, m2 / n};
}

class LayerChangesClientTest : public AggregatorSuite<LayerChangesClientTest> {
 public:
  static constexpr char kScratchName[] = "layer-changes";
  static std::vector<std::string> AggregatorFlags() {
    return {"--round_timeout_ms=20000"};
  }

 protected:
  LayerChangesClientTest() : client_(Options()) {
    options_.num_features = kChannels;
  }

  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(10);
    o.round_timeout = absl::Seconds(30);
    return o;
  }

  v1::JobInfo Create(v1::CreateJobRequest job) {
    *job.add_layers() = *ToLayerSpec(options_, "bn");
    job.set_round_timeout_ms(20000);
    auto info = client_.CreateJob(job);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : v1::JobInfo();
  }

  // World `n`: rank r has 2 + r rows around 3 * r.
  std::vector<Worker> Workers(const std::string& job, int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Worker> workers(n);
    for (int r = 0; r < n; ++r) {
      Worker& w = workers[r];
      w.rank = r;
      w.group = client_.NewNodeGroup(job, r);
      w.layer =
          std::make_unique<SyncBatchNorm>(0, options_, w.group.get(), nullptr);
      w.batch = 2 + r;
      std::normal_distribution<float> normal(3.0f * r, 1.5f);
      w.x.resize(w.batch * kChannels * kSpatial);
      for (float& v : w.x) v = normal(rng);
    }
    return workers;
  }

  // The aggregator's statistics of `group`, through the layer loader.
  RunningStats ServiceStats(const std::string& job, int group) {
    SyncBatchNorm probe(0, options_, nullptr, nullptr);
    SyncBatchNorm* layers[] = {&probe};
    EXPECT_TRUE(LoadRunningStats(client_, job, group, layers).ok());
    return probe.running_stats();
  }

  Client client_;
  SyncBatchNormOptions options_;
};

TEST_F(LayerChangesClientTest, GroupsAsRankListsNormalizeWithTheirOwnRanks) {
  v1::CreateJobRequest job;
  job.set_job_id("groups-0-2-and-1-3");
  job.set_world_size(4);
  for (const std::vector<int>& g : {std::vector<int>{2, 0}, {1, 3}}) {
    v1::RankGroup* group = job.add_groups();
    for (int r : g) group->add_ranks(r);
  }
  const v1::JobInfo info = Create(job);
  ASSERT_EQ(info.groups_size(), 2);
  EXPECT_EQ(info.group_size(), 0);
  EXPECT_EQ(NumGroups(info), 2);
  std::vector<Worker> workers = Workers(job.job_id(), 4, 5);
  InParallel(workers, [](Worker& w) { w.status = Forward(w); });
  for (Worker& w : workers) {
    SCOPED_TRACE(absl::StrCat("rank ", w.rank));
    ASSERT_TRUE(w.status.ok()) << w.status;
    const int group = *GroupOf(info, w.rank);
    EXPECT_EQ(group, w.rank % 2);
    std::vector<Worker*> members;
    for (Worker& o : workers) {
      if (o.rank % 2 == w.rank % 2) members.push_back(&o);
    }
    for (int c = 0; c < kChannels; ++c) {
      const auto [mean, var] = Stats(members, c);
      for (int64_t b = 0; b < w.batch; ++b) {
        for (int64_t s = 0; s < kSpatial; ++s) {
          const size_t i = (b * kChannels + c) * kSpatial + s;
          const long double want = (w.x[i] - mean) / std::sqrt(var + kEps);
          EXPECT_NEAR(w.y[i], static_cast<double>(want), 1e-5);
        }
      }
    }
    const RunningStats service = ServiceStats(job.job_id(), group);
    EXPECT_EQ(w.layer->running_stats().mean, service.mean);
    EXPECT_EQ(w.layer->running_stats().var, service.var);
  }
}

TEST_F(LayerChangesClientTest, MomentumAndImportsReachTheService) {
  v1::CreateJobRequest job;
  job.set_job_id("changes");
  job.set_world_size(2);
  Create(job);
  std::vector<Worker> workers = Workers(job.job_id(), 2, 6);
  InParallel(workers, [](Worker& w) { w.status = Forward(w); });
  RunningStats loaded = RunningStats::Initial(kChannels);
  loaded.num_batches_tracked = 5;
  loaded.mean = {1, -1, 2};
  // Both change the layer alike: momentum 1 (apex's test) and an import.
  InParallel(workers, [&](Worker& w) {
    w.layer->set_momentum(MomentumMode::kTorch, 1.0);
    w.status = w.layer->ImportRunningStats(loaded);
    if (w.status.ok()) w.status = Forward(w);
  });
  std::vector<Worker*> all = {&workers[0], &workers[1]};
  const RunningStats service = ServiceStats(job.job_id(), 0);
  EXPECT_EQ(service.num_batches_tracked, 6);
  for (Worker& w : workers) {
    ASSERT_TRUE(w.status.ok()) << w.status;
    EXPECT_EQ(w.layer->running_stats().num_batches_tracked, 6);
    EXPECT_EQ(w.layer->running_stats().mean, service.mean);
    EXPECT_EQ(w.layer->running_stats().var, service.var);
  }
  const int64_t n = (workers[0].batch + workers[1].batch) * kSpatial;
  for (int c = 0; c < kChannels; ++c) {
    const auto [mean, var] = Stats(all, c);
    EXPECT_NEAR(service.mean[c], static_cast<double>(mean), 1e-9);
    EXPECT_NEAR(service.var[c], static_cast<double>(var * n / (n - 1)), 1e-9);
  }
  // Only rank 0 imports: the round fails on both, applying nothing.
  InParallel(workers, [&](Worker& w) {
    if (w.rank == 0) w.status = w.layer->ImportRunningStats(loaded);
    if (w.status.ok()) w.status = Forward(w);
  });
  for (Worker& w : workers) {
    EXPECT_EQ(w.status.code(), absl::StatusCode::kInvalidArgument) << w.status;
    EXPECT_EQ(std::string(*w.status.GetPayload(kRoundErrorReasonUrl)),
              "RANKS_DISAGREE");
  }
  EXPECT_EQ(ServiceStats(job.job_id(), 0).num_batches_tracked, 6);
}

}  // namespace
}  // namespace syncnorm::testing
