// Elastic membership end to end: worker threads send their rounds to a
// real aggregator process through the generated stub (a generic gRPC
// client) while ranks leave, die and are removed, and join; the aggregator
// is killed with SIGKILL and restarted at random moments. Every answer must
// be the merge of the members in force at its step, and the running
// statistics a float64 replay of the same membership history.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/retry.h"
#include "tests/testing/round_payload.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

constexpr int kChannels = 3;
constexpr int kSteps = 30;
constexpr double kMomentum = 0.1;

// The steps [first, end) each rank runs: rank 3 leaves from step 10, rank
// 2 dies before step 14 and is removed, ranks 4 and 5 join at step 20.
struct Span {
  int first, end;
};
constexpr Span kSchedule[6] = {{0, kSteps}, {0, kSteps},  {0, 14},
                               {0, 10},     {20, kSteps}, {20, kSteps}};

bool Runs(int rank, int step) {
  return step >= kSchedule[rank].first && step < kSchedule[rank].end;
}

std::vector<int> MembersAt(int step) {
  std::vector<int> m;
  for (int r = 0; r < 6; ++r) {
    if (Runs(r, step)) m.push_back(r);
  }
  return m;
}

// The local batch of (rank, step): 4 samples per channel.
std::vector<double> Samples(int rank, int step, int channel) {
  std::vector<double> x;
  for (int i = 0; i < 4; ++i) {
    x.push_back(std::cos(0.3 + rank * 1.7 + step * 0.9 + channel * 2.3 + i) *
                    (1.0 + 0.5 * rank) +
                0.1 * step);
  }
  return x;
}

v1::Contribution Forward(int rank, int step) {
  std::vector<std::vector<double>> x;
  for (int ch = 0; ch < kChannels; ++ch) x.push_back(Samples(rank, step, ch));
  return SampledForward("elastic", step, rank, x);
}

// Two-pass float64 mean and M2 of the members' concatenated batches.
void Reference(int step, int channel, double& mean, double& m2, int& n) {
  std::vector<double> all;
  for (int r : MembersAt(step)) {
    const std::vector<double> x = Samples(r, step, channel);
    all.insert(all.end(), x.begin(), x.end());
  }
  n = static_cast<int>(all.size());
  mean = 0;
  for (double v : all) mean += v;
  mean /= n;
  m2 = 0;
  for (double v : all) m2 += (v - mean) * (v - mean);
}

TEST(ElasticSystemTest, MembersChangeThroughKillsAndStatsEqualAFloat64Replay) {
  const std::string dir = MakeScratchDir("elastic");
  const std::vector<std::string> flags = {"--round_timeout_ms=30000"};
  auto started = AggregatorProcess::Start(dir, flags);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<AggregatorProcess> agg = *std::move(started);
  const std::string address = agg->address();
  const int port = agg->port();
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  v1::CreateJobRequest create;
  create.set_job_id("elastic");
  create.set_world_size(6);
  for (int r : {0, 1, 2, 3}) create.add_members(r);
  v1::LayerSpec* layer = create.add_layers();
  layer->set_name("bn");
  layer->set_num_features(kChannels);
  layer->set_momentum_mode(v1::MOMENTUM_TORCH);
  layer->set_momentum(kMomentum);
  v1::JobInfo info;
  ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                return stub->CreateJob(c, create, &info);
              }).ok());
  const auto change = [&](int64_t step, std::vector<int> join,
                          std::vector<int> leave, std::vector<int> remove) {
    v1::UpdateMembershipRequest r;
    r.set_job_id("elastic");
    r.set_step(step);
    for (int x : join) r.add_join(x);
    for (int x : leave) r.add_leave(x);
    for (int x : remove) r.add_remove(x);
    v1::JobInfo out;
    grpc::Status s = RetryWhileDown([&](grpc::ClientContext* c) {
      return stub->UpdateMembership(c, r, &out);
    });
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  };
  // Rank 3 says ahead of time that it leaves from step 10.
  EXPECT_EQ(change(10, {}, {3}, {}).membership().version(), 1);

  // Each worker: its rounds in lock step, every answer checked.
  std::atomic<int> at_step[6] = {};
  absl::Notification changed;  // the removal and the join are recorded
  absl::Mutex mu;
  std::vector<std::string> errors;
  const auto worker = [&](int rank) {
    for (int step = kSchedule[rank].first; step < kSchedule[rank].end; ++step) {
      if (step == 15 || step == kSchedule[rank].first) {
        if (step >= 15) changed.WaitForNotification();
      }
      at_step[rank] = step;
      const v1::Contribution c = Forward(rank, step);
      v1::RoundResult result;
      const grpc::Status s = RetryWhileDown([&](grpc::ClientContext* context) {
        return stub->ReduceOnce(context, c, &result);
      });
      absl::MutexLock lock(&mu);
      if (!s.ok()) {
        errors.push_back(absl::StrCat("rank ", rank, " step ", step, ": ",
                                      s.error_message()));
        return;
      }
      for (int ch = 0; ch < kChannels; ++ch) {
        double mean, m2;
        int n;
        Reference(step, ch, mean, m2, n);
        if (result.moments().count() != n ||
            std::abs(result.moments().mean(ch) - mean) > 1e-12 ||
            std::abs(result.moments().var(ch) - m2 / n) > 1e-12) {
          errors.push_back(absl::StrCat("rank ", rank, " step ", step,
                                        " channel ", ch, ": got ",
                                        result.moments().ShortDebugString()));
        }
      }
    }
    at_step[rank] = kSteps + 1;
  };
  std::vector<std::thread> workers;
  for (int r = 0; r < 4; ++r) workers.emplace_back(worker, r);

  // The operator: once ranks 0 and 1 wait in step 14 for the dead rank 2,
  // it is removed; then ranks 4 and 5 are announced for step 20.
  std::thread operator_thread([&] {
    while (at_step[0] < 14 || at_step[1] < 14) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(100));
    const v1::JobInfo removed = change(0, {}, {}, {2});
    EXPECT_EQ(removed.membership().history().rbegin()->step(), 14);
    change(20, {4, 5}, {}, {});
    changed.Notify();
    workers.emplace_back(worker, 4);
    workers.emplace_back(worker, 5);
  });

  // Meanwhile the aggregator is killed and restarted: while rank 3's leave
  // is ahead, while ranks 0 and 1 wait for the dead rank (around its
  // removal), and after the join.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int> pause_ms(0, 30);
  for (int at : {5, 14, 22}) {
    while (at_step[0] < at) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(pause_ms(rng)));
    agg->process().Signal(SIGKILL);
    ASSERT_TRUE(agg->process().Wait(absl::Seconds(10)).ok());
    auto again = AggregatorProcess::Start(
        dir, {flags[0], absl::StrCat("--listen=127.0.0.1:", port)});
    ASSERT_TRUE(again.ok()) << again.status();
    agg = *std::move(again);
  }
  operator_thread.join();
  for (std::thread& t : workers) t.join();
  for (const std::string& e : errors) ADD_FAILURE() << e;

  // The history as recorded, and the statistics as replayed in float64.
  v1::GetJobRequest get;
  get.set_job_id("elastic");
  ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                return stub->GetJob(c, get, &info);
              }).ok());
  ASSERT_EQ(info.membership().history_size(), 4);
  EXPECT_EQ(info.membership().history(1).step(), 10);
  EXPECT_EQ(info.membership().history(2).removed(0), 2);
  EXPECT_EQ(info.membership().history(3).step(), 20);
  EXPECT_EQ(info.committed_step(), kSteps - 1);
  v1::GetRunningStatsRequest stats_request;
  stats_request.set_job_id("elastic");
  v1::RunningStats stats;
  ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                return stub->GetRunningStats(c, stats_request, &stats);
              }).ok());
  ASSERT_EQ(stats.layers_size(), 1);
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), kSteps);
  for (int ch = 0; ch < kChannels; ++ch) {
    double running_mean = 0, running_var = 1;
    for (int step = 0; step < kSteps; ++step) {
      double mean, m2;
      int n;
      Reference(step, ch, mean, m2, n);
      running_mean = (1 - kMomentum) * running_mean + kMomentum * mean;
      running_var = (1 - kMomentum) * running_var + kMomentum * m2 / (n - 1);
    }
    EXPECT_NEAR(stats.layers(0).running_mean(ch), running_mean, 1e-12);
    EXPECT_NEAR(stats.layers(0).running_var(ch), running_var, 1e-12);
  }
}

}  // namespace
}  // namespace syncnorm::testing
