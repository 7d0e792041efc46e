// The client's reconnects, against the aggregator binary: a round goes on
// within a second or two of its server's return, after a kill -9 and
// restart, and after a connection that the server's kernel accepted but
// nothing answered (a server restarting, paused, or behind a stalled
// middlebox; here a proxy that holds it silent), not after gRPC's 20 s
// default connect timeout. The test runs without gRPC's backup poller, so
// a client that leaves its connection attempts unpolled hangs for certain.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/contributor.h"
#include "client/forward_reply.h"
#include "client/layer_spec.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "tests/testing/cluster.h"
#include "tests/testing/tcp_proxy.h"

namespace syncnorm::testing {
namespace {

constexpr char kJob[] = "reconnect";

// Rank 0's contribution at `step`: count 4, per-channel mean and M2 that
// change with the step.
Moments Local(int64_t step) {
  Moments m = Moments::Zero(3);
  m.count = 4;
  m.mean = {1.0 * step, -0.5, 2.0};
  m.m2 = {4.0, 8.0, 0.5 * (step + 1)};
  return m;
}

// A one-rank job's global moments are the rank's own: mean, and the biased
// variance M2 / count.
void ExpectOwnMoments(const absl::StatusOr<ForwardReply>& reply, int64_t step) {
  ASSERT_TRUE(reply.ok()) << "step " << step << ": " << reply.status();
  const Moments want = Local(step);
  ASSERT_EQ(reply->global.mean.size(), want.mean.size());
  for (size_t c = 0; c < want.mean.size(); ++c) {
    EXPECT_EQ(reply->global.mean[c], want.mean[c]) << "step " << step;
    EXPECT_EQ(reply->global.var[c], want.m2[c] / want.count) << "step " << step;
  }
}

// A one-rank job of one 3-channel layer, created through `client`.
absl::Status CreateJob(Client& client) {
  v1::CreateJobRequest job;
  job.set_job_id(kJob);
  job.set_world_size(1);
  SyncBatchNormOptions bn;
  bn.num_features = 3;
  *job.add_layers() = *ToLayerSpec(bn, "bn");
  return client.CreateJob(job).status();
}

ClientOptions OptionsFor(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(10);
  o.round_timeout = absl::Seconds(30);  // above gRPC's 20 s connect timeout
  return o;
}

// Runs the round of `step` on another thread while `outage` runs here;
// `outage` returns when the server answers again. Returns how long after
// that the round was answered.
template <typename Outage>
absl::Duration RoundAcross(Contributor& c, int64_t step, Outage outage) {
  absl::StatusOr<ForwardReply> reply = absl::UnknownError("not run");
  absl::Time answered;
  std::thread round([&] {
    reply = c.ReduceForward(0, step, Local(step));
    answered = absl::Now();
  });
  const absl::Time back = outage();
  round.join();
  ExpectOwnMoments(reply, step);
  std::fprintf(stderr, "step %lld answered %s after the server was back\n",
               static_cast<long long>(step),
               absl::FormatDuration(answered - back).c_str());
  return answered - back;
}

TEST(ReconnectTest, ARoundGoesOnWithinSecondsOfAConnectionThatNobodyAnswers) {
  auto agg = AggregatorProcess::Start(MakeScratchDir("reconnect-held"));
  ASSERT_TRUE(agg.ok()) << agg.status();
  auto proxy = TcpProxy::Start((*agg)->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  ClientOptions options =
      OptionsFor(absl::StrCat("127.0.0.1:", (*proxy)->port()));
  options.connect_timeout = absl::Seconds(1);
  Client client(options);
  ASSERT_TRUE(CreateJob(client).ok());
  std::unique_ptr<Contributor> c = client.NewContributor(kJob, 0);
  ExpectOwnMoments(c->ReduceForward(0, 0, Local(0)), 0);

  // Cut the connection; the client's next one is accepted and held silent.
  (*proxy)->HoldNew(true);
  ASSERT_GE((*proxy)->DropAll(), 1);
  const absl::Duration took = RoundAcross(*c, 1, [&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while ((*proxy)->held() == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_GE((*proxy)->held(), 1) << "the client never reconnected";
    // New connections reach the server again; the held one stays silent
    // until the client gives up on it.
    (*proxy)->HoldNew(false);
    return absl::Now();
  });
  // The client gives a connection attempt its connect timeout (the
  // default, 5 s, would miss this bound), then a new one is polled to its
  // end.
  EXPECT_LT(took, options.connect_timeout + absl::Seconds(3))
      << "the round waited on a connection that nobody answered";
  EXPECT_EQ((*proxy)->held(), 1);
  ExpectOwnMoments(c->ReduceForward(0, 2, Local(2)), 2);
}

TEST(ReconnectTest, ARoundGoesOnWithinSecondsOfItsServersRestart) {
  const std::string dir = MakeScratchDir("reconnect-restart");
  auto agg = AggregatorProcess::Start(dir);
  ASSERT_TRUE(agg.ok()) << agg.status();
  const int port = (*agg)->port();
  Client client(OptionsFor((*agg)->address()));
  ASSERT_TRUE(CreateJob(client).ok());
  std::unique_ptr<Contributor> c = client.NewContributor(kJob, 0);
  ExpectOwnMoments(c->ReduceForward(0, 0, Local(0)), 0);

  (*agg)->process().Signal(SIGKILL);
  ASSERT_TRUE((*agg)->process().Wait(absl::Seconds(10)).ok());
  const absl::Duration took = RoundAcross(*c, 1, [&] {
    // Refused for a while: the client keeps retrying.
    absl::SleepFor(absl::Milliseconds(500));
    agg = AggregatorProcess::Start(dir,
                                   {absl::StrCat("--listen=127.0.0.1:", port)});
    EXPECT_TRUE(agg.ok()) << agg.status();
    return absl::Now();  // it listens
  });
  // gRPC's reconnect backoff is at most 1 s (client/client.cc).
  EXPECT_LT(took, absl::Seconds(4)) << "the round missed the server's return";
  ExpectOwnMoments(c->ReduceForward(0, 2, Local(2)), 2);
}

}  // namespace
}  // namespace syncnorm::testing
