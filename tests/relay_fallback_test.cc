// A client whose relay is gone falls back to the shards: a relay killed
// (SIGKILL) and not replaced, before or after it forwarded its block, costs
// the round about the client's connect timeout, not its round timeout, and
// every answer equals bit for bit the same inputs' answer in a job without
// a relay (and the float64 reference). A relay that comes back takes the
// later rounds; with ClientOptions::relay_fallback off the rounds wait for
// the relay, as before; the round's own errors do not fall back.
#include <signal.h>

#include <cstdio>
#include <cstring>
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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "tests/testing/cluster.h"
#include "tests/testing/scrape.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"

namespace syncnorm {
namespace {

namespace ref = ::syncnorm::reference;
using ::testing::HasSubstr;
using testing::Subprocess;

constexpr int kChannels = 5;
// How soon a client gives up on its relay (ClientOptions::connect_timeout).
constexpr absl::Duration kBound = absl::Seconds(1);

// Starts the relay binary on `listen` in front of `upstream`; sets `port`
// once it serves.
absl::StatusOr<std::unique_ptr<Subprocess>> StartRelay(
    const std::string& upstream, const std::string& listen,
    const std::string& dir, int& port) {
  const std::string port_file = absl::StrCat(dir, "/relay-port");
  std::remove(port_file.c_str());
  absl::StatusOr<std::unique_ptr<Subprocess>> relay = Subprocess::Spawn(
      {testing::Runfile("relay/syncnorm_relay"), "--listen=" + listen,
       "--upstream=" + upstream, "--port_file=" + port_file},
      absl::StrCat(dir, "/relay.log"));
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

// One round's inputs: each rank's moments of its own random batch, and the
// float64 reference of the whole batch.
struct RoundInput {
  std::vector<Moments> local;  // by rank
  ref::Stats global;
};

RoundInput MakeInput(int world, int64_t step) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + step));
  std::normal_distribution<double> value(0.5, 2.0);
  std::uniform_int_distribution<int> rows(1, 4);
  RoundInput in;
  std::vector<ref::Layout> layouts;
  std::vector<std::vector<double>> xs(world);
  for (int r = 0; r < world; ++r) {
    layouts.push_back(ref::Layout{{rows(rng), kChannels}});
    for (int64_t i = 0; i < layouts[r].size(); ++i) xs[r].push_back(value(rng));
    const ref::Stats s = ref::Moments(layouts[r], xs[r]);
    Moments m;
    m.count = s.count;
    for (int ch = 0; ch < kChannels; ++ch) {
      m.mean.push_back(static_cast<double>(s.mean[ch]));
      m.m2.push_back(static_cast<double>(s.m2[ch]));
    }
    in.local.push_back(std::move(m));
  }
  std::vector<const std::vector<double>*> ptrs;
  for (const auto& x : xs) ptrs.push_back(&x);
  in.global = ref::Moments(kChannels, layouts, ptrs);
  return in;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class RelayFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeScratchDir("relay_fallback");
    absl::StatusOr<std::unique_ptr<testing::AggregatorProcess>> aggregator =
        testing::AggregatorProcess::Start(dir_,
                                          {"--metrics_listen=127.0.0.1:0"});
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    metrics_port_ =
        testing::MetricsPortFromLog(absl::StrCat(dir_, "/aggregator.log"));
    ASSERT_GT(metrics_port_, 0);
    ASSERT_TRUE(
        StartRelay(aggregator_->address(), "127.0.0.1:0", relay_port_).ok());
  }

  absl::Status StartRelay(const std::string& address, const std::string& listen,
                          int& port) {
    absl::StatusOr<std::unique_ptr<Subprocess>> relay =
        syncnorm::StartRelay(address, listen, dir_, port);
    if (!relay.ok()) return relay.status();
    relay_ = *std::move(relay);
    return absl::OkStatus();
  }

  void KillRelay() {
    relay_->Signal(SIGKILL);
    ASSERT_TRUE(relay_->Wait(absl::Seconds(5)).ok());
  }

  ClientOptions Options(bool relay) const {
    ClientOptions options;
    options.address = aggregator_->address();
    if (relay) options.relay = absl::StrCat("127.0.0.1:", relay_port_);
    options.connect_timeout = kBound;
    options.round_timeout = absl::Seconds(20);
    return options;
  }

  // Creates `job` of `world` ranks and one layer.
  void CreateJob(Client& client, const std::string& job, int world,
                 int64_t round_timeout_ms = 15000) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.set_round_timeout_ms(round_timeout_ms);
    request.add_layers()->set_num_features(kChannels);
    absl::StatusOr<v1::JobInfo> info = client.CreateJob(request);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  // The relay's calls to the shard that were answered OK: one per block
  // round it forwarded merged.
  // The shard's ReduceOnce calls answered OK, once the count has settled:
  // the shard counts a call when it is over, which may be after the relay
  // fanned its answer out to the ranks.
  double RelayCalls() const {
    auto read = [this] {
      return testing::HandledCalls(testing::ScrapeMetrics(metrics_port_),
                                   "ReduceOnce", "OK");
    };
    double last = read();
    for (const absl::Time until = absl::Now() + absl::Seconds(2);
         absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(20));
      const double now = read();
      if (now == last) break;
      last = now;
    }
    return last;
  }

  // Waits until the shard holds a ReduceOnce call (a forwarded block).
  bool AwaitHeldCall() const {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (absl::Now() < until) {
      std::optional<double> held = testing::Sample(
          testing::ScrapeMetrics(metrics_port_), "syncnorm_waiting_calls");
      if (held.has_value() && *held >= 1) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<testing::AggregatorProcess> aggregator_;
  std::unique_ptr<Subprocess> relay_;
  int metrics_port_ = 0;
  int relay_port_ = 0;
};

// The answers of `in` sent directly, in a job of its own: the reference
// that every path must match bit for bit.
std::vector<ForwardReply> Direct(Client& client, const std::string& job,
                                 int64_t step, const RoundInput& in) {
  const int world = static_cast<int>(in.local.size());
  std::vector<absl::StatusOr<ForwardReply>> replies(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      replies[r] =
          client.NewNodeGroup(job, r)->SyncForward(0, step, in.local[r]);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<ForwardReply> out;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(replies[r].ok())
        << "direct rank " << r << ": " << replies[r].status();
    out.push_back(replies[r].ok() ? *replies[r] : ForwardReply());
  }
  return out;
}

// One round of every rank of `groups`, each from its own thread.
std::vector<absl::StatusOr<ForwardReply>> Step(
    const std::vector<std::unique_ptr<NodeGroup>>& groups, int64_t step,
    const RoundInput& in) {
  std::vector<absl::StatusOr<ForwardReply>> replies(groups.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < groups.size(); ++r) {
    threads.emplace_back(
        [&, r] { replies[r] = groups[r]->SyncForward(0, step, in.local[r]); });
  }
  for (auto& t : threads) t.join();
  return replies;
}

// Every rank's answer equals the direct answer's bits and the reference.
void ExpectAnswers(const std::vector<absl::StatusOr<ForwardReply>>& replies,
                   const std::vector<ForwardReply>& direct,
                   const RoundInput& in) {
  for (size_t r = 0; r < replies.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_TRUE(replies[r].ok()) << replies[r].status();
    EXPECT_EQ(replies[r]->global.count, in.global.count);
    EXPECT_TRUE(SameBits(replies[r]->global.mean, direct[r].global.mean));
    EXPECT_TRUE(SameBits(replies[r]->global.var, direct[r].global.var));
    ref::ExpectClose(replies[r]->global.mean, in.global.mean, 1e-12, "mean");
    ref::ExpectClose(replies[r]->global.var, in.global.Var(), 1e-12, "var");
  }
}

// A job of 16 ranks: 0..7 through the relay (one block), 8..15 directly.
// The relay forwards the block of step 0 and is killed before the shard
// answers it; the block's ranks resend to the shard, which answers them as
// retries. Later steps stay on the shards until the relay is back.
TEST_F(RelayFallbackTest,
       ABlockForwardedBeforeTheRelayDiedIsAnsweredByTheShard) {
  constexpr int kWorld = 16;
  Client relayed(Options(/*relay=*/true));
  Client direct(Options(/*relay=*/false));
  CreateJob(direct, "j", kWorld);
  CreateJob(direct, "direct", kWorld);
  std::vector<std::unique_ptr<NodeGroup>> groups;
  for (int r = 0; r < kWorld; ++r) {
    groups.push_back(r < 8 ? relayed.NewNodeGroup("j", r)
                           : direct.NewNodeGroup("j", r));
  }
  const RoundInput in0 = MakeInput(kWorld, 0);
  std::vector<absl::StatusOr<ForwardReply>> replies(kWorld);
  std::vector<std::thread> threads;
  auto send = [&](int r) {
    replies[r] = groups[r]->SyncForward(0, 0, in0.local[r]);
  };
  for (int r = 0; r < 8; ++r) threads.emplace_back(send, r);
  ASSERT_TRUE(AwaitHeldCall()) << "the relay did not forward its block";
  const double before = RelayCalls();
  const absl::Time killed = absl::Now();
  KillRelay();
  for (int r = 8; r < kWorld; ++r) threads.emplace_back(send, r);
  for (auto& t : threads) t.join();
  // Detected within kBound, then one round trip to the shard.
  EXPECT_LT(absl::Now() - killed, 4 * kBound);
  ExpectAnswers(replies, Direct(direct, "direct", 0, in0), in0);

  // The relay stays gone: steps 1..5 go to the shard from the start.
  for (int64_t step = 1; step <= 5; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const RoundInput in = MakeInput(kWorld, step);
    const absl::Time start = absl::Now();
    replies = Step(groups, step, in);
    EXPECT_LT(absl::Now() - start, kBound);
    ExpectAnswers(replies, Direct(direct, "direct", step, in), in);
  }
  EXPECT_EQ(RelayCalls(), before);

  // A relay at the same address takes the ranks back at a window's first
  // step (a multiple of 8), all of the block at once: one merged block a
  // round from then on.
  int again = 0;
  ASSERT_TRUE(StartRelay(aggregator_->address(),
                         absl::StrCat("127.0.0.1:", relay_port_), again)
                  .ok());
  ASSERT_EQ(again, relay_port_);
  // The channels' reconnect backoff is at most 1 s.
  absl::SleepFor(absl::Seconds(2));
  int64_t back = -1;
  for (int64_t step = 6; step <= 24; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const double calls = RelayCalls();
    const RoundInput in = MakeInput(kWorld, step);
    ExpectAnswers(Step(groups, step, in), Direct(direct, "direct", step, in),
                  in);
    const double added = RelayCalls() - calls;
    if (back < 0 && added > 0) back = step;
    EXPECT_EQ(added, back < 0 ? 0 : 1);
  }
  EXPECT_EQ(back, 8);
}

// Ranks 0..6 wait in the relay's block for rank 7 when it is killed; they
// and rank 7 (whose client finds no relay at all) complete at the shard.
TEST_F(RelayFallbackTest, AnIncompleteBlockCompletesAtTheShardWithoutItsRelay) {
  constexpr int kWorld = 8;
  Client relayed(Options(/*relay=*/true));
  Client direct(Options(/*relay=*/false));
  CreateJob(direct, "j", kWorld);
  CreateJob(direct, "direct", kWorld);
  const RoundInput in = MakeInput(kWorld, 0);
  std::vector<absl::StatusOr<ForwardReply>> replies(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {
    threads.emplace_back([&, r] {
      replies[r] = relayed.NewNodeGroup("j", r)->SyncForward(0, 0, in.local[r]);
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  KillRelay();
  replies[kWorld - 1] = relayed.NewNodeGroup("j", kWorld - 1)
                            ->SyncForward(0, 0, in.local[kWorld - 1]);
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - killed, 4 * kBound);
  ExpectAnswers(replies, Direct(direct, "direct", 0, in), in);
}

// A rank whose channel finds the relay back a window before the rest of
// its block (their way to it is held silent) goes to the relay on
// probation; the incomplete block does not answer, so within the connect
// timeout it resends to the shard and waits there for the next window,
// when the whole block returns.
TEST_F(RelayFallbackTest, ARankBackBeforeItsBlockFallsBackWithinTheBound) {
  constexpr int kWorld = 8;
  absl::StatusOr<std::unique_ptr<testing::TcpProxy>> proxy =
      testing::TcpProxy::Start(relay_port_);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  Client early(Options(/*relay=*/true));
  ClientOptions late_options = Options(/*relay=*/true);
  late_options.relay = absl::StrCat("127.0.0.1:", (*proxy)->port());
  Client late(late_options);
  Client direct(Options(/*relay=*/false));
  CreateJob(direct, "j", kWorld);
  CreateJob(direct, "direct", kWorld);
  std::vector<std::unique_ptr<NodeGroup>> groups;
  groups.push_back(early.NewNodeGroup("j", 0));
  for (int r = 1; r < kWorld; ++r) groups.push_back(late.NewNodeGroup("j", r));
  auto step = [&](int64_t s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    const RoundInput in = MakeInput(kWorld, s);
    const double calls = RelayCalls();
    const absl::Time start = absl::Now();
    ExpectAnswers(Step(groups, s, in), Direct(direct, "direct", s, in), in);
    EXPECT_LT(absl::Now() - start, 4 * kBound);
    return RelayCalls() - calls;
  };
  EXPECT_EQ(step(0), 1);
  KillRelay();
  (*proxy)->HoldNew(true);
  for (int64_t s = 1; s <= 3; ++s) EXPECT_EQ(step(s), 0);
  int again = 0;
  ASSERT_TRUE(StartRelay(aggregator_->address(),
                         absl::StrCat("127.0.0.1:", relay_port_), again)
                  .ok());
  absl::SleepFor(absl::Seconds(2));  // the early client's channel connects
  // Step 8: rank 0 alone on the relay, then on the shard within the bound.
  for (int64_t s = 4; s <= 15; ++s) EXPECT_EQ(step(s), 0);
  (*proxy)->HoldNew(false);
  (*proxy)->DropAll();
  absl::SleepFor(absl::Seconds(2));  // the late client's channel connects
  for (int64_t s = 16; s <= 17; ++s) EXPECT_EQ(step(s), 1);
}

// A relay whose connections are accepted and then left silent (a paused
// process, a stalled middlebox) is unreachable once the handshake has
// taken connect_timeout: the rounds complete at the shard soon after.
TEST_F(RelayFallbackTest, ASilentRelayIsUnreachableAfterTheConnectTimeout) {
  constexpr int kWorld = 2;
  absl::StatusOr<std::unique_ptr<testing::TcpProxy>> proxy =
      testing::TcpProxy::Start(relay_port_);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  (*proxy)->HoldNew(true);
  ClientOptions options = Options(/*relay=*/true);
  options.relay = absl::StrCat("127.0.0.1:", (*proxy)->port());
  Client silent(options);
  Client direct(Options(/*relay=*/false));
  CreateJob(direct, "j", kWorld);
  CreateJob(direct, "direct", kWorld);
  std::vector<std::unique_ptr<NodeGroup>> groups;
  for (int r = 0; r < kWorld; ++r)
    groups.push_back(silent.NewNodeGroup("j", r));
  const RoundInput in = MakeInput(kWorld, 0);
  const absl::Time start = absl::Now();
  ExpectAnswers(Step(groups, 0, in), Direct(direct, "direct", 0, in), in);
  EXPECT_LT(absl::Now() - start, 4 * kBound);
  EXPECT_GT((*proxy)->held(), 0);
}

// relay_fallback off: today's behaviour, the round waits for the relay
// until the client's round timeout. On, the same round reaches the shard,
// whose own answer (DEADLINE_EXCEEDED naming the ranks that never sent) is
// returned as it is.
TEST_F(RelayFallbackTest, OffTheRoundWaitsForTheRelayOnTheShardAnswers) {
  Client admin(Options(/*relay=*/false));
  CreateJob(admin, "j", 2, /*round_timeout_ms=*/1000);
  KillRelay();
  const Moments local{2, std::vector<double>(kChannels, 1.0),
                      std::vector<double>(kChannels, 0.5)};

  ClientOptions off = Options(/*relay=*/true);
  off.relay_fallback = false;
  off.round_timeout = absl::Milliseconds(1500);
  Client waiting(off);
  absl::Time start = absl::Now();
  absl::StatusOr<ForwardReply> r =
      waiting.NewNodeGroup("j", 0)->SyncForward(0, 0, local);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("round timeout"));
  EXPECT_GE(absl::Now() - start, off.round_timeout);

  ClientOptions on = off;
  on.relay_fallback = true;
  on.round_timeout = absl::Seconds(20);
  Client falling_back(on);
  start = absl::Now();
  r = falling_back.NewNodeGroup("j", 0)->SyncForward(0, 0, local);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("waiting for ranks [1]"))
      << r.status();
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("round timeout")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// The round's own errors, through a live relay, are its answer: rank 0's
// refused contribution (INVALID_ARGUMENT) and rank 1's round that missed
// rank 0 (DEADLINE_EXCEEDED). Both keep their relay, which merges the next
// round's block at once.
TEST_F(RelayFallbackTest, TheRoundsOwnErrorsDoNotFallBack) {
  constexpr int kWorld = 2;
  Client relayed(Options(/*relay=*/true));
  CreateJob(relayed, "j", kWorld, /*round_timeout_ms=*/1000);
  std::vector<std::unique_ptr<NodeGroup>> groups;
  for (int r = 0; r < kWorld; ++r)
    groups.push_back(relayed.NewNodeGroup("j", r));
  RoundInput in = MakeInput(kWorld, 0);
  const Moments negative{-1, in.local[0].mean, in.local[0].m2};
  absl::StatusOr<ForwardReply> refused, missed;
  std::thread rank1(
      [&] { missed = groups[1]->SyncForward(0, 0, in.local[1]); });
  refused = groups[0]->SyncForward(0, 0, negative);
  rank1.join();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
      << refused.status();
  EXPECT_EQ(missed.status().code(), absl::StatusCode::kDeadlineExceeded)
      << missed.status();

  in = MakeInput(kWorld, 1);
  const double calls = RelayCalls();
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<ForwardReply>> replies(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back(
        [&, r] { replies[r] = groups[r]->SyncForward(0, 1, in.local[r]); });
  }
  for (auto& t : threads) t.join();
  // A block of the relay, complete: not held until the job's deadline.
  EXPECT_LT(absl::Now() - start, kBound);
  EXPECT_EQ(RelayCalls() - calls, 1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(replies[r].ok()) << replies[r].status();
    ref::ExpectClose(replies[r]->global.mean, in.global.mean, 1e-12, "mean");
    ref::ExpectClose(replies[r]->global.var, in.global.Var(), 1e-12, "var");
  }
}

}  // namespace
}  // namespace syncnorm
