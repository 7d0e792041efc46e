// A relay killed in the middle of a round: its ranks' streams break, their
// clients resend to a replacement relay at the same address, and the round
// completes with every rank's contribution, as the float64 reference says.
#include <signal.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "testing/local_aggregator.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

namespace ref = ::syncnorm::reference;
using testing::Subprocess;

constexpr int kWorld = 8;
constexpr int kChannels = 4;

// Starts the relay binary on `listen`; its port once it serves.
absl::StatusOr<std::unique_ptr<Subprocess>> StartRelay(
    const std::string& upstream, const std::string& listen,
    const std::string& dir, int& port) {
  const std::string port_file = absl::StrCat(dir, "/port");
  std::remove(port_file.c_str());
  absl::StatusOr<std::unique_ptr<Subprocess>> relay = Subprocess::Spawn(
      {testing::Runfile("relay/syncnorm_relay"), "--listen=" + listen,
       "--upstream=" + upstream, "--port_file=" + port_file});
  if (!relay.ok()) return relay.status();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until) {
    if (absl::SimpleAtoi(
            absl::StripAsciiWhitespace(testing::ReadFile(port_file)), &port) &&
        port > 0) {
      return relay;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("the relay did not start");
}

TEST(RelayRestartTest, RanksResendToAReplacementRelayAndTheRoundCompletes) {
  absl::StatusOr<std::unique_ptr<testing::LocalAggregator>> aggregator =
      testing::LocalAggregator::Start();
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  const std::string dir = testing::MakeScratchDir("relay_restart");
  int port = 0;
  absl::StatusOr<std::unique_ptr<Subprocess>> relay =
      StartRelay((*aggregator)->address(), "127.0.0.1:0", dir, port);
  ASSERT_TRUE(relay.ok()) << relay.status();

  ClientOptions options;
  options.address = (*aggregator)->address();
  options.relay = absl::StrCat("127.0.0.1:", port);
  options.round_timeout = absl::Seconds(20);
  Client client(options);
  v1::CreateJobRequest request;
  request.set_job_id("restart");
  request.set_world_size(kWorld);
  request.set_round_timeout_ms(15000);
  request.add_layers()->set_num_features(kChannels);
  ASSERT_TRUE(client.CreateJob(request).ok());

  // Each rank's random batch, and the reference of the whole batch.
  std::mt19937 rng(5);
  std::normal_distribution<double> value(-1.0, 1.5);
  std::vector<ref::Layout> layouts;
  std::vector<std::vector<double>> xs(kWorld);
  std::vector<Moments> local(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    layouts.push_back(ref::Layout{{3 + r % 3, kChannels}});
    for (int64_t i = 0; i < layouts[r].size(); ++i) xs[r].push_back(value(rng));
    const ref::Stats s = ref::Moments(layouts[r], xs[r]);
    local[r].count = s.count;
    for (int ch = 0; ch < kChannels; ++ch) {
      local[r].mean.push_back(static_cast<double>(s.mean[ch]));
      local[r].m2.push_back(static_cast<double>(s.m2[ch]));
    }
  }
  std::vector<const std::vector<double>*> ptrs;
  for (const auto& x : xs) ptrs.push_back(&x);
  const ref::Stats global = ref::Moments(kChannels, layouts, ptrs);

  std::vector<absl::StatusOr<ForwardReply>> replies(kWorld);
  auto send = [&](int r) {
    std::unique_ptr<NodeGroup> group = client.NewNodeGroup("restart", r);
    replies[r] = group->SyncForward(0, 0, local[r]);
  };
  // Ranks 0..6 wait in the relay's block for rank 7.
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) threads.emplace_back(send, r);
  absl::SleepFor(absl::Milliseconds(300));
  (*relay)->Signal(SIGKILL);
  ASSERT_TRUE((*relay)->Wait(absl::Seconds(5)).ok());
  int again = 0;
  absl::StatusOr<std::unique_ptr<Subprocess>> replacement = StartRelay(
      (*aggregator)->address(), absl::StrCat("127.0.0.1:", port), dir, again);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ(again, port);
  threads.emplace_back(send, kWorld - 1);
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_TRUE(replies[r].ok()) << replies[r].status();
    EXPECT_EQ(replies[r]->global.count, global.count);
    ref::ExpectClose(replies[r]->global.mean, global.mean, 1e-12, "mean");
    ref::ExpectClose(replies[r]->global.var, global.Var(), 1e-12, "var");
  }
}

}  // namespace
}  // namespace syncnorm
