// Two workers of one job, each with its own uneven shard of the batch, train
// a SyncBatchNorm layer through an aggregator that runs inside this test
// (syncnorm::testing::LocalAggregator). Each worker's output must be plain
// batch norm over the concatenated batch, computed here in float64, and its
// running statistics those of torch's rule on that batch.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/layer_spec.h"
#include "client/sync_batch_norm.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "testing/local_aggregator.h"

namespace {

constexpr int kChannels = 4;
constexpr int kPixels = 6;  // H x W = 2 x 3
constexpr int kSteps = 3;
constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;
const std::vector<int> kBatch = {3, 5};  // rank 0 and rank 1

// x[n][c][pixel] of one worker, as float32 in NCHW order.
using Shard = std::vector<float>;

float At(const Shard& x, int n, int c, int p) {
  return x[(n * kChannels + c) * kPixels + p];
}

// Batch norm of the concatenated batch in float64: the mean and biased
// variance of each channel over every worker's samples and pixels.
struct Reference {
  std::vector<double> mean, var;
  int64_t count = 0;
};

Reference Concatenated(const std::vector<Shard>& shards) {
  Reference ref;
  for (int c = 0; c < kChannels; ++c) {
    double sum = 0;
    int64_t count = 0;
    for (size_t r = 0; r < shards.size(); ++r) {
      for (int n = 0; n < kBatch[r]; ++n) {
        for (int p = 0; p < kPixels; ++p) sum += At(shards[r], n, c, p);
        count += kPixels;
      }
    }
    const double mean = sum / count;
    double m2 = 0;
    for (size_t r = 0; r < shards.size(); ++r) {
      for (int n = 0; n < kBatch[r]; ++n) {
        for (int p = 0; p < kPixels; ++p) {
          const double d = At(shards[r], n, c, p) - mean;
          m2 += d * d;
        }
      }
    }
    ref.mean.push_back(mean);
    ref.var.push_back(m2 / count);
    ref.count = count;
  }
  return ref;
}

TEST(TwoWorkersTest, OutputsAreBatchNormOfTheConcatenatedBatch) {
  absl::StatusOr<std::unique_ptr<syncnorm::testing::LocalAggregator>>
      aggregator = syncnorm::testing::LocalAggregator::Start();
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();

  syncnorm::ClientOptions client_options;
  client_options.address = (*aggregator)->address();
  syncnorm::Client client(client_options);

  syncnorm::SyncBatchNormOptions bn;
  bn.num_features = kChannels;
  bn.eps = kEps;
  bn.momentum = kMomentum;  // torch's rule
  syncnorm::v1::CreateJobRequest job;
  job.set_job_id("consumer-job");
  job.set_world_size(2);
  absl::StatusOr<syncnorm::v1::LayerSpec> spec =
      syncnorm::ToLayerSpec(bn, "bn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  *job.add_layers() = *spec;
  absl::StatusOr<syncnorm::v1::JobInfo> created = client.CreateJob(job);
  ASSERT_TRUE(created.ok()) << created.status();

  // Fresh data for every step and rank, far from zero mean and unit scale.
  std::mt19937 random(2024);
  std::normal_distribution<float> normal(3.0f, 2.5f);
  std::vector<std::vector<Shard>> inputs(kSteps, std::vector<Shard>(2));
  for (auto& step : inputs) {
    for (int r = 0; r < 2; ++r) {
      step[r].resize(kBatch[r] * kChannels * kPixels);
      for (float& v : step[r]) v = normal(random);
    }
  }

  // Each worker: its own node group (Reduce stream) and layer, on a thread.
  std::vector<std::vector<Shard>> outputs(kSteps, std::vector<Shard>(2));
  std::vector<syncnorm::RunningStats> running(2);
  std::vector<absl::Status> failures(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      std::unique_ptr<syncnorm::NodeGroup> group =
          client.NewNodeGroup("consumer-job", rank);
      syncnorm::SyncBatchNorm layer(/*layer=*/0, bn, group.get(),
                                    /*pool=*/nullptr);
      const std::vector<int64_t> shape = {kBatch[rank], kChannels, 2, 3};
      for (int step = 0; step < kSteps; ++step) {
        Shard& y = outputs[step][rank];
        y.assign(inputs[step][rank].size(), NAN);  // unwritten values show
        absl::Status s = layer.Forward({inputs[step][rank].data(), shape},
                                       {y.data(), shape});
        if (!s.ok()) {
          failures[rank] = s;
          return;
        }
      }
      running[rank] = layer.running_stats();
    });
  }
  for (std::thread& w : workers) w.join();
  ASSERT_TRUE(failures[0].ok()) << failures[0];
  ASSERT_TRUE(failures[1].ok()) << failures[1];

  std::vector<double> running_mean(kChannels, 0.0);
  std::vector<double> running_var(kChannels, 1.0);
  for (int step = 0; step < kSteps; ++step) {
    const Reference ref = Concatenated(inputs[step]);
    for (int r = 0; r < 2; ++r) {
      for (int n = 0; n < kBatch[r]; ++n) {
        for (int c = 0; c < kChannels; ++c) {
          for (int p = 0; p < kPixels; ++p) {
            const double expected =
                (At(inputs[step][r], n, c, p) - ref.mean[c]) /
                std::sqrt(ref.var[c] + kEps);
            // float32 outputs of values of order 1.
            EXPECT_NEAR(At(outputs[step][r], n, c, p), expected, 2e-6)
                << "step " << step << " rank " << r << " n " << n << " c " << c
                << " pixel " << p;
          }
        }
      }
    }
    // torch: running = (1 - m) running + m batch, var unbiased n / (n - 1).
    for (int c = 0; c < kChannels; ++c) {
      running_mean[c] =
          (1 - kMomentum) * running_mean[c] + kMomentum * ref.mean[c];
      running_var[c] = (1 - kMomentum) * running_var[c] +
                       kMomentum * ref.var[c] * ref.count / (ref.count - 1);
    }
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(running[r].num_batches_tracked, kSteps);
    ASSERT_EQ(running[r].mean.size(), kChannels);
    ASSERT_EQ(running[r].var.size(), kChannels);
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_NEAR(running[r].mean[c], running_mean[c], 1e-12);
      EXPECT_NEAR(running[r].var[c], running_var[c], 1e-12);
    }
  }
}

}  // namespace
