// Stale-synchronous rounds end to end: worker threads in lock step (a
// forward, its answer, a backward, its answer) against a real aggregator
// process through the generated stub (a generic gRPC client), one rank
// deliberately slow, the aggregator killed with SIGKILL and restarted
// mid-run. Every answer must be the float64 merge (or sum) of the view it
// names, no rank may be answered more than tau steps ahead of another's
// sends, and the running statistics must equal, bit for bit, those of a
// synchronous job fed the same contributions.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/retry.h"
#include "tests/testing/round_payload.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kChannels = 3;
constexpr int kSteps = 40;
constexpr int kStaleness = 2;
constexpr int kSlowRank = 3;

std::vector<double> Samples(int rank, int step, int channel) {
  std::vector<double> x;
  for (int i = 0; i < 5; ++i) {
    x.push_back(std::sin(0.7 + rank * 1.9 + step * 0.37 + channel * 2.9 + i) *
                    (1.0 + 0.3 * rank) -
                0.05 * step);
  }
  return x;
}

double Grad(int rank, int step, int channel, int which) {
  return which == 0 ? 0.5 * rank + 0.01 * step + channel
                    : std::cos(rank + 0.1 * step + channel);
}

v1::Contribution Forward(const std::string& job, int rank, int step) {
  std::vector<std::vector<double>> x;
  for (int ch = 0; ch < kChannels; ++ch) x.push_back(Samples(rank, step, ch));
  return SampledForward(job, step, rank, x);
}

v1::Contribution Backward(const std::string& job, int rank, int step) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(0);
  c.set_step(step);
  c.set_phase(v1::BACKWARD);
  c.set_rank(rank);
  for (int ch = 0; ch < kChannels; ++ch) {
    c.mutable_grad_sums()->add_sum_dy(Grad(rank, step, ch, 0));
    c.mutable_grad_sums()->add_sum_dy_xmu(Grad(rank, step, ch, 1));
  }
  return c;
}

v1::CreateJobRequest Job(const std::string& id, int staleness) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(kWorld);
  r.set_staleness(staleness);
  r.set_round_timeout_ms(30000);
  v1::LayerSpec* layer = r.add_layers();
  layer->set_name("bn");
  layer->set_num_features(kChannels);
  return r;
}

TEST(StaleSystemTest, ASlowRankWithinTheBoundThroughKillsMatchesSync) {
  const std::string dir = MakeScratchDir("stale");
  auto started = AggregatorProcess::Start(dir);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<AggregatorProcess> agg = *std::move(started);
  const std::string address = agg->address();
  const int port = agg->port();
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (const auto& [id, tau] : std::vector<std::pair<std::string, int>>{
           {"stale", kStaleness}, {"sync", 0}}) {
    v1::JobInfo info;
    const v1::CreateJobRequest r = Job(id, tau);
    ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                  return stub->CreateJob(c, r, &info);
                }).ok());
    EXPECT_EQ(info.staleness(), tau);
  }

  std::atomic<int> sent[kWorld];  // the latest forward step each has sent
  for (auto& s : sent) s = -1;
  std::atomic<int> answered_ahead{0};  // answers with someone > tau behind
  std::atomic<int> max_staleness{0};
  absl::Mutex mu;
  std::vector<std::string> errors;
  const auto fail = [&](std::string e) {
    absl::MutexLock lock(&mu);
    errors.push_back(std::move(e));
  };
  const auto worker = [&](int rank) {
    for (int step = 0; step < kSteps; ++step) {
      if (rank == kSlowRank) absl::SleepFor(absl::Milliseconds(6));
      const v1::Contribution f = Forward("stale", rank, step);
      sent[rank] = step;
      v1::RoundResult fr;
      grpc::Status s = RetryWhileDown(
          [&](grpc::ClientContext* c) { return stub->ReduceOnce(c, f, &fr); });
      if (!s.ok()) {
        fail(absl::StrCat("rank ", rank, " forward ", step, ": ",
                          s.error_message()));
        return;
      }
      for (int w = 0; w < kWorld; ++w) {
        if (sent[w] < step - kStaleness) ++answered_ahead;
      }
      // The answer is the float64 merge of the batches it names.
      std::vector<std::vector<double>> all(kChannels);
      int oldest = step;
      for (const v1::ViewEntry& v : fr.view()) {
        if (v.step() > step || v.step() < step - kStaleness) {
          fail(absl::StrCat("rank ", rank, " step ", step, ": view step ",
                            v.step(), " of rank ", v.rank()));
        }
        oldest = std::min<int>(oldest, v.step());
        for (int ch = 0; ch < kChannels; ++ch) {
          const std::vector<double> x = Samples(v.rank(), v.step(), ch);
          all[ch].insert(all[ch].end(), x.begin(), x.end());
        }
      }
      int seen = max_staleness;
      while (step - oldest > seen &&
             !max_staleness.compare_exchange_weak(seen, step - oldest)) {
      }
      for (int ch = 0; ch < kChannels; ++ch) {
        double mean = 0;
        for (double v : all[ch]) mean += v;
        mean /= all[ch].size();
        double ss = 0;
        for (double v : all[ch]) ss += (v - mean) * (v - mean);
        if (fr.moments().count() != static_cast<int64_t>(all[ch].size()) ||
            std::abs(fr.moments().mean(ch) - mean) > 1e-12 ||
            std::abs(fr.moments().var(ch) - ss / all[ch].size()) > 1e-12) {
          fail(absl::StrCat("rank ", rank, " step ", step, ": ",
                            fr.ShortDebugString()));
        }
      }
      const v1::Contribution b = Backward("stale", rank, step);
      v1::RoundResult br;
      s = RetryWhileDown(
          [&](grpc::ClientContext* c) { return stub->ReduceOnce(c, b, &br); });
      if (!s.ok()) {
        fail(absl::StrCat("rank ", rank, " backward ", step, ": ",
                          s.error_message()));
        return;
      }
      // The backward sums the grads of the forward's view, no other.
      if (br.view_size() != fr.view_size()) {
        fail(absl::StrCat("rank ", rank, " step ", step,
                          ": backward view differs"));
        continue;
      }
      for (int ch = 0; ch < kChannels; ++ch) {
        double dy = 0, dyx = 0;
        for (const v1::ViewEntry& v : fr.view()) {
          dy += Grad(v.rank(), v.step(), ch, 0);
          dyx += Grad(v.rank(), v.step(), ch, 1);
        }
        if (std::abs(br.grad_sums().sum_dy(ch) - dy) > 1e-12 ||
            std::abs(br.grad_sums().sum_dy_xmu(ch) - dyx) > 1e-12) {
          fail(absl::StrCat("rank ", rank, " backward ", step, ": ",
                            br.ShortDebugString()));
        }
      }
    }
  };
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorld; ++r) workers.emplace_back(worker, r);
  // Killed while the slow rank is at steps 10 and 25.
  for (int at : {10, 25}) {
    while (sent[kSlowRank] < at) absl::SleepFor(absl::Milliseconds(1));
    agg->process().Signal(SIGKILL);
    ASSERT_TRUE(agg->process().Wait(absl::Seconds(10)).ok());
    auto again = AggregatorProcess::Start(
        dir, {absl::StrCat("--listen=127.0.0.1:", port)});
    ASSERT_TRUE(again.ok()) << again.status();
    agg = *std::move(again);
  }
  for (std::thread& t : workers) t.join();
  for (const std::string& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(answered_ahead.load(), 0);
  // The fast ranks did run ahead of the slow one: the bound was used.
  EXPECT_GT(max_staleness.load(), 0);
  EXPECT_LE(max_staleness.load(), kStaleness);

  // The synchronous job, fed the same forwards step by step.
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        const v1::Contribution f = Forward("sync", r, step);
        v1::RoundResult result;
        EXPECT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                      return stub->ReduceOnce(c, f, &result);
                    }).ok());
      });
    }
    for (std::thread& t : ranks) t.join();
  }
  v1::RunningStats stale_stats, sync_stats;
  v1::GetRunningStatsRequest req;
  req.set_job_id("stale");
  ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                return stub->GetRunningStats(c, req, &stale_stats);
              }).ok());
  req.set_job_id("sync");
  ASSERT_TRUE(RetryWhileDown([&](grpc::ClientContext* c) {
                return stub->GetRunningStats(c, req, &sync_stats);
              }).ok());
  EXPECT_EQ(stale_stats.layers(0).num_batches_tracked(), kSteps);
  EXPECT_EQ(stale_stats.layers(0).running_mean().size(), kChannels);
  EXPECT_EQ(stale_stats.layers(0).SerializeAsString(),
            sync_stats.layers(0).SerializeAsString())
      << stale_stats.ShortDebugString() << "\n"
      << sync_stats.ShortDebugString();
}

}  // namespace
}  // namespace syncnorm::testing
