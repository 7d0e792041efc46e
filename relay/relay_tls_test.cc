// TLS on both hops of the relay, end to end against the real binaries: a
// TLS relay in front of a TLS aggregator, mutual TLS on the ranks' side,
// the loopback-only rule for plaintext, and a relay that dials a TLS-only
// aggregator in plaintext. Certificates are made with the openssl CLI.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/certificates.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

using testing::AggregatorProcess;
using testing::ReadFile;
using testing::Subprocess;

// A relay process and the address it serves on.
struct RelayProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;
};

// Starts the relay binary on a free loopback port with `flags`; serving
// when it returns. The relay's log is `dir`/relay.log.
absl::StatusOr<RelayProcess> StartRelay(const std::string& dir,
                                        std::vector<std::string> flags) {
  const std::string port_file = dir + "/relay.port";
  std::remove(port_file.c_str());
  flags.insert(flags.begin(),
               {testing::Runfile("relay/syncnorm_relay"),
                "--listen=127.0.0.1:0", "--port_file=" + port_file});
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Spawn(flags, dir + "/relay.log");
  if (!p.ok()) return p.status();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until) {
    int port = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)),
                         &port) &&
        port > 0) {
      return RelayProcess{*std::move(p), absl::StrCat("127.0.0.1:", port)};
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the relay did not start: ", ReadFile(dir + "/relay.log")));
}

v1::CreateJobRequest Job(const std::string& id, int world) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(world);
  r.set_round_timeout_ms(2000);
  r.add_layers()->set_num_features(3);
  return r;
}

// Rank `rank`'s forward contribution: counts and moments that differ by
// rank, so that the merge's order and weights show in the result.
v1::Contribution Forward(const std::string& job, int rank) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(0);
  c.set_step(1);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(3 + 2 * rank);
  for (int ch = 0; ch < 3; ++ch) {
    c.mutable_moments()->add_mean(0.1 * ch - 0.37 * rank + 1.0 / (rank + 3));
    c.mutable_moments()->add_m2(1.5 + 0.29 * rank * (ch + 1));
  }
  return c;
}

// One forward round of `job` by ranks 0..world-1 at once through `client`:
// each rank's answer.
std::vector<absl::StatusOr<v1::RoundResult>> Round(const Client& client,
                                                   const std::string& job,
                                                   int world) {
  std::vector<absl::StatusOr<v1::RoundResult>> results(
      world, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = client.NewContributor(job, r)->Round(Forward(job, r));
    });
  }
  for (std::thread& t : ranks) t.join();
  return results;
}

// A round refused at the connection: the client resends while the relay
// is unreachable (a restarting relay looks the same), so what it returns
// at its round timeout is DEADLINE_EXCEEDED carrying the last UNAVAILABLE.
void ExpectUnavailable(const absl::Status& status) {
  EXPECT_TRUE(absl::IsUnavailable(status) ||
              (absl::IsDeadlineExceeded(status) &&
               absl::StrContains(status.message(), "UNAVAILABLE")))
      << status;
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(5);
  o.round_timeout = absl::Seconds(10);
  return o;
}

class RelayTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeScratchDir("relay_tls");
    ASSERT_EQ(testing::MakeCertificates(dir_), absl::OkStatus());
  }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }
  std::string Pem(const std::string& name) const {
    return *ReadPemFile(File(name));
  }
  std::string dir_;
};

TEST_F(RelayTlsTest, RanksRoundThroughATlsRelayToATlsAggregator) {
  auto aggregator = AggregatorProcess::Start(
      dir_,
      {"--tls_cert=" + File("server.crt"), "--tls_key=" + File("server.key")});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay = StartRelay(
      dir_,
      {"--upstream=" + (*aggregator)->address(), "--block_positions=4",
       "--tls_cert=" + File("server.crt"), "--tls_key=" + File("server.key"),
       "--upstream_tls", "--upstream_tls_root_ca=" + File("ca.crt")});
  ASSERT_TRUE(relay.ok()) << relay.status();

  ClientOptions direct_options = Options((*aggregator)->address());
  direct_options.tls = true;
  direct_options.tls_root_ca = Pem("ca.crt");
  ClientOptions relayed_options = direct_options;
  relayed_options.relay = relay->address;
  Client direct(direct_options);
  Client relayed(relayed_options);
  // 6 ranks: a full block of 4 and a block of 2.
  constexpr int kWorld = 6;
  ASSERT_TRUE(direct.CreateJob(Job("direct", kWorld)).ok());
  ASSERT_TRUE(direct.CreateJob(Job("relayed", kWorld)).ok());

  const auto want = Round(direct, "direct", kWorld);
  const auto got = Round(relayed, "relayed", kWorld);
  ASSERT_TRUE(want[0].ok()) << want[0].status();
  ASSERT_EQ(want[0]->moments().mean_size(), 3);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    // Aligned blocks merge as subtrees of the shard's merge: bit for bit
    // the direct round.
    EXPECT_EQ(got[r]->moments().count(), want[0]->moments().count());
    for (int ch = 0; ch < 3; ++ch) {
      EXPECT_EQ(got[r]->moments().mean(ch), want[0]->moments().mean(ch));
      EXPECT_EQ(got[r]->moments().var(ch), want[0]->moments().var(ch));
    }
  }
  // The relay's ranks' side is TLS: a plaintext rank gets no round.
  ClientOptions plaintext = Options((*aggregator)->address());
  plaintext.relay = relay->address;
  plaintext.round_timeout = absl::Seconds(2);
  ExpectUnavailable(Client(plaintext)
                        .NewContributor("relayed", 0)
                        ->Round(Forward("relayed", 0))
                        .status());
}

TEST_F(RelayTlsTest, MutualTlsRefusesARankWithoutACertificate) {
  auto aggregator = AggregatorProcess::Start(dir_, {});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + (*aggregator)->address(),
                        "--tls_cert=" + File("server.crt"),
                        "--tls_key=" + File("server.key"),
                        "--tls_client_ca=" + File("ca.crt")});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ASSERT_TRUE(
      Client(Options((*aggregator)->address())).CreateJob(Job("m", 1)).ok());

  // Only the relay's channel carries a Contributor's rounds, so the TLS
  // options below are the relay's hop alone.
  ClientOptions no_cert = Options((*aggregator)->address());
  no_cert.relay = relay->address;
  no_cert.tls_root_ca = Pem("ca.crt");
  no_cert.round_timeout = absl::Seconds(2);
  ExpectUnavailable(
      Client(no_cert).NewContributor("m", 0)->Round(Forward("m", 0)).status());

  ClientOptions with_cert = no_cert;
  with_cert.round_timeout = absl::Seconds(10);
  with_cert.tls_client_cert = Pem("client.crt");
  with_cert.tls_client_key = Pem("client.key");
  absl::StatusOr<v1::RoundResult> round =
      Client(with_cert).NewContributor("m", 0)->Round(Forward("m", 0));
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(round->moments().count(), 3);
}

TEST_F(RelayTlsTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  const std::string log = File("refused.log");
  auto p = Subprocess::Spawn({testing::Runfile("relay/syncnorm_relay"),
                              "--listen=0.0.0.0:0", "--upstream=127.0.0.1:1"},
                             log);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "--allow_insecure"))
      << ReadFile(log);

  // The flags later on the command line win: every address, allowed.
  absl::StatusOr<RelayProcess> relay = StartRelay(
      dir_,
      {"--upstream=127.0.0.1:1", "--listen=0.0.0.0:0", "--allow_insecure"});
  EXPECT_TRUE(relay.ok()) << relay.status();
}

// The rank's round through `relay` of a job of one rank on the shard at
// `shard`, with a round timeout far above the time a mismatch takes to be
// answered: its status and how long it took.
struct Timed {
  absl::Status status;
  absl::Duration took;
};
Timed RoundThrough(const RelayProcess& relay, const std::string& shard,
                   const std::string& job) {
  ClientOptions rank = Options(shard);
  rank.relay = relay.address;
  rank.round_timeout = absl::Seconds(40);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RoundResult> round =
      Client(rank).NewContributor(job, 0)->Round(Forward(job, 0));
  return Timed{round.status(), absl::Now() - start};
}

// A TLS mismatch with the shard is answered at once, not resent for 30 s
// as to a shard that is down: FAILED_PRECONDITION (the client does not
// resend it), naming the shard, its address and the relay's flags.
void ExpectFastMismatch(const Timed& t, const std::string& address,
                        const std::string& advice) {
  EXPECT_EQ(t.status.code(), absl::StatusCode::kFailedPrecondition) << t.status;
  EXPECT_LT(t.took, absl::Seconds(5)) << t.status;
  for (const std::string& part :
       {std::string("shard 0 (") + address + ")", std::string("TLS mismatch"),
        std::string("--upstream_tls_root_ca"), advice}) {
    EXPECT_TRUE(absl::StrContains(t.status.message(), part))
        << "lacks '" << part << "': " << t.status;
  }
}

TEST_F(RelayTlsTest, APlaintextUpstreamToATlsAggregatorFailsFast) {
  auto aggregator = AggregatorProcess::Start(
      dir_,
      {"--tls_cert=" + File("server.crt"), "--tls_key=" + File("server.key")});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + (*aggregator)->address()});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ClientOptions creator = Options((*aggregator)->address());
  creator.tls_root_ca = Pem("ca.crt");
  ASSERT_TRUE(Client(creator).CreateJob(Job("p", 1)).ok());

  // The shard closes the plaintext connection: the relay probes it with
  // TLS, sees a certificate, and answers the rank within the probe's time.
  ExpectFastMismatch(RoundThrough(*relay, (*aggregator)->address(), "p"),
                     (*aggregator)->address(), "--upstream_tls and");
  // Once known, at once.
  ExpectFastMismatch(RoundThrough(*relay, (*aggregator)->address(), "p"),
                     (*aggregator)->address(), "dials it in plaintext");
  EXPECT_TRUE(absl::StrContains(ReadFile(dir_ + "/relay.log"),
                                "event=upstream_tls_mismatch"))
      << ReadFile(dir_ + "/relay.log");
}

TEST_F(RelayTlsTest, TheWrongCaUpstreamFailsFast) {
  auto aggregator = AggregatorProcess::Start(
      dir_,
      {"--tls_cert=" + File("server.crt"), "--tls_key=" + File("server.key")});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + (*aggregator)->address(),
                        "--upstream_tls_root_ca=" + File("other-ca.crt")});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ClientOptions creator = Options((*aggregator)->address());
  creator.tls_root_ca = Pem("ca.crt");
  ASSERT_TRUE(Client(creator).CreateJob(Job("w", 1)).ok());
  ExpectFastMismatch(RoundThrough(*relay, (*aggregator)->address(), "w"),
                     (*aggregator)->address(), "certificate verify failed");
}

TEST_F(RelayTlsTest, ATlsUpstreamToAPlaintextAggregatorFailsFast) {
  auto aggregator = AggregatorProcess::Start(dir_, {});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + (*aggregator)->address(),
                        "--upstream_tls_root_ca=" + File("ca.crt")});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ASSERT_TRUE(
      Client(Options((*aggregator)->address())).CreateJob(Job("t", 1)).ok());
  ExpectFastMismatch(RoundThrough(*relay, (*aggregator)->address(), "t"),
                     (*aggregator)->address(), "drop --upstream_tls");
}

TEST_F(RelayTlsTest, AMutualTlsShardWithoutTheRelaysCertificateFailsFast) {
  auto aggregator =
      AggregatorProcess::Start(dir_, {"--tls_cert=" + File("server.crt"),
                                      "--tls_key=" + File("server.key"),
                                      "--tls_client_ca=" + File("ca.crt")});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + (*aggregator)->address(),
                        "--upstream_tls_root_ca=" + File("ca.crt")});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ClientOptions creator = Options((*aggregator)->address());
  creator.tls_root_ca = Pem("ca.crt");
  creator.tls_client_cert = Pem("client.crt");
  creator.tls_client_key = Pem("client.key");
  ASSERT_TRUE(Client(creator).CreateJob(Job("m", 1)).ok());
  ExpectFastMismatch(RoundThrough(*relay, (*aggregator)->address(), "m"),
                     (*aggregator)->address(), "--upstream_tls_client_cert");
}

// A shard that is merely down is still resent to: its rank's round
// completes once the shard is back.
TEST_F(RelayTlsTest, AShardThatIsDownIsStillResentTo) {
  auto first = AggregatorProcess::Start(dir_, {});
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  const std::string address = (*first)->address();
  ASSERT_TRUE(Client(Options(address)).CreateJob(Job("d", 1)).ok());
  ASSERT_TRUE((*first)->Stop().ok());
  absl::StatusOr<RelayProcess> relay =
      StartRelay(dir_, {"--upstream=" + address});
  ASSERT_TRUE(relay.ok()) << relay.status();
  std::unique_ptr<AggregatorProcess> back;
  std::thread restart([&] {
    absl::SleepFor(absl::Seconds(2));
    // The same data dir: the job is there.
    auto again = AggregatorProcess::Start(
        dir_, {absl::StrCat("--listen=127.0.0.1:", port)});
    if (again.ok()) back = *std::move(again);
  });
  const Timed t = RoundThrough(*relay, address, "d");
  restart.join();
  ASSERT_NE(back, nullptr);
  EXPECT_TRUE(t.status.ok()) << t.status;
  EXPECT_GT(t.took, absl::Seconds(1));
}

}  // namespace
}  // namespace syncnorm
