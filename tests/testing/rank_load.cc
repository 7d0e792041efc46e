#include "tests/testing/rank_load.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "tests/testing/cluster.h"

namespace syncnorm::testing {
namespace {

GradSums NormalGradSums(std::mt19937_64& rng, int channels) {
  std::normal_distribution<double> normal;
  GradSums g;
  for (int c = 0; c < channels; ++c) {
    g.sum_dy.push_back(normal(rng));
    g.sum_dy_xmu.push_back(normal(rng));
  }
  return g;
}

// One rank's steps; OK or its first error.
absl::Status RunRank(const Client& client, const RankLoadOptions& o, int rank) {
  std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(rank));
  const double shift = rank == o.outlier_rank ? o.outlier_shift : 0;
  std::unique_ptr<NodeGroup> group = client.NewNodeGroup(o.job_id, rank);
  for (int64_t step = 1; step <= o.steps; ++step) {
    for (int layer = 0; layer < o.layers; ++layer) {
      const Moments local = NormalMoments(rng, o.channels, o.batch, shift);
      if (auto r = group->SyncForward(layer, step, local); !r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat("rank ", rank, " step ", step,
                                         " FORWARD: ", r.status().message()));
      }
    }
    for (int layer = o.layers - 1; o.backward && layer >= 0; --layer) {
      auto r = group->SyncBackward(layer, step, /*backward=*/0,
                                   NormalGradSums(rng, o.channels));
      if (!r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat("rank ", rank, " step ", step,
                                         " BACKWARD: ", r.status().message()));
      }
    }
    if (o.pace > absl::ZeroDuration()) absl::SleepFor(o.pace);
  }
  return absl::OkStatus();
}

}  // namespace

Moments NormalMoments(std::mt19937_64& rng, int channels, int n, double shift) {
  std::normal_distribution<double> normal(shift, 1.0);
  Moments m = Moments::Zero(channels);
  m.count = n;
  std::vector<double> x(n);
  for (int c = 0; c < channels; ++c) {
    double sum = 0;
    for (double& v : x) sum += v = normal(rng);
    const double mean = sum / n;
    double m2 = 0;
    for (double v : x) m2 += (v - mean) * (v - mean);
    m.mean[c] = mean;
    m.m2[c] = m2;
  }
  return m;
}

absl::Status RunRankLoad(const RankLoadOptions& o) {
  ClientOptions client_options;
  client_options.address = o.address;
  Client client(client_options);
  StackConfig config;
  config.world_size = o.world_size;
  config.channels.assign(o.layers, o.channels);
  if (auto job =
          client.CreateJob(JobRequest(config, o.job_id, o.round_timeout_ms));
      !job.ok()) {
    return job.status();
  }
  absl::Mutex mu;
  absl::Status first;  // guarded by mu
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < o.world_size; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::Status s = RunRank(client, o, rank);
      absl::MutexLock lock(&mu);
      if (first.ok()) first = s;
    });
  }
  for (std::thread& t : ranks) t.join();
  return first;
}

}  // namespace syncnorm::testing
