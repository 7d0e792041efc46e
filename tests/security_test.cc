// TLS, mutual TLS, bearer tokens (scopes, reload, never logged), the
// loopback-only rule for plaintext and the limits, end to end against the
// real binary. Certificates are made at test time with the openssl CLI.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/certificates.h"
#include "tests/testing/cluster.h"
#include "tests/testing/health.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

using ::syncnorm::testing::AggregatorProcess;
using ::syncnorm::testing::CheckHealth;
using ::syncnorm::testing::MakeCertificates;
using ::syncnorm::testing::MakeScratchDir;
using ::syncnorm::testing::ReadFile;
using ::syncnorm::testing::Runfile;
using ::syncnorm::testing::Subprocess;

constexpr char kAdminToken[] = "admin-0a1b2c3d4e5f6a7b8c9d";
constexpr char kJobAToken[] = "job-a-9f8e7d6c5b4a3f2e1d0c";
constexpr char kJobBToken[] = "job-b-00112233445566778899";
constexpr char kLateToken[] = "late-aabbccddeeff00112233";
constexpr char kRelayToken[] = "relay-5a6b7c8d9e0f1a2b3c4d";

void WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(3);
  o.round_timeout = absl::Seconds(5);
  return o;
}

v1::CreateJobRequest Job(const std::string& id, int world = 1, int layers = 1,
                         int channels = 2) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(world);
  r.set_round_timeout_ms(2000);
  for (int l = 0; l < layers; ++l) {
    v1::LayerSpec* layer = r.add_layers();
    layer->set_name(absl::StrCat("bn", l));
    layer->set_num_features(channels);
  }
  return r;
}

v1::Contribution Forward(const std::string& job, int64_t step, int rank,
                         int channels = 2) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(0);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(4);
  for (int i = 0; i < channels; ++i) {
    c.mutable_moments()->add_mean(1.0 + i);
    c.mutable_moments()->add_m2(2.0);
  }
  return c;
}

// One forward round of a world-size-1 job through the client's Reduce
// stream: its status.
absl::Status OneRound(const Client& client, const std::string& job,
                      int64_t step = 1) {
  std::unique_ptr<Contributor> c = client.NewContributor(job, 0);
  return c->Round(Forward(job, step, 0)).status();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir("security"); }
  std::string dir_;
};

TEST_F(SecurityTest, TlsServesEncryptedAndRefusesPlaintextClients) {
  ASSERT_EQ(MakeCertificates(dir_), absl::OkStatus());
  auto server =
      AggregatorProcess::Start(dir_, {"--tls_cert=" + dir_ + "/server.crt",
                                      "--tls_key=" + dir_ + "/server.key"});
  ASSERT_TRUE(server.ok()) << server.status();

  ClientOptions tls = Options((*server)->address());
  tls.tls_root_ca = *ReadPemFile(dir_ + "/ca.crt");
  Client client(tls);
  ASSERT_TRUE(client.CreateJob(Job("tls")).ok());
  EXPECT_TRUE(OneRound(client, "tls").ok());

  Client plain(Options((*server)->address()));
  EXPECT_EQ(plain.GetJob("tls").status().code(),
            absl::StatusCode::kUnavailable);
  // A client that does not trust the server's CA is refused too.
  ClientOptions untrusting = Options((*server)->address());
  untrusting.tls_root_ca = *ReadPemFile(dir_ + "/other-ca.crt");
  EXPECT_FALSE(Client(untrusting).GetJob("tls").ok());
  EXPECT_EQ((*server)->Stop().value_or(-1), 0);
}

TEST_F(SecurityTest, MutualTlsRejectsAClientWithoutACertificate) {
  ASSERT_EQ(MakeCertificates(dir_), absl::OkStatus());
  auto server =
      AggregatorProcess::Start(dir_, {"--tls_cert=" + dir_ + "/server.crt",
                                      "--tls_key=" + dir_ + "/server.key",
                                      "--tls_client_ca=" + dir_ + "/ca.crt"});
  ASSERT_TRUE(server.ok()) << server.status();

  ClientOptions no_cert = Options((*server)->address());
  no_cert.tls_root_ca = *ReadPemFile(dir_ + "/ca.crt");
  EXPECT_EQ(Client(no_cert).CreateJob(Job("m")).status().code(),
            absl::StatusCode::kUnavailable);

  ClientOptions with_cert = no_cert;
  with_cert.tls_client_cert = *ReadPemFile(dir_ + "/client.crt");
  with_cert.tls_client_key = *ReadPemFile(dir_ + "/client.key");
  Client client(with_cert);
  ASSERT_TRUE(client.CreateJob(Job("m")).ok());
  EXPECT_TRUE(OneRound(client, "m").ok());
}

struct CtlRun {
  int code = -1;
  std::string out, err;
};

// Runs syncnormctl with `args`; its exit code and output.
CtlRun Ctl(const std::string& dir, const std::vector<std::string>& args) {
  const std::string out = dir + "/ctl.out", err = dir + "/ctl.err";
  const std::string cmd =
      absl::StrCat(Runfile("client/ctl/syncnormctl"), " ",
                   absl::StrJoin(args, " "), " >", out, " 2>", err);
  const int status = std::system(cmd.c_str());
  CtlRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

TEST_F(SecurityTest, SyncnormctlTakesMutualTlsAndATokenFile) {
  ASSERT_EQ(MakeCertificates(dir_), absl::OkStatus());
  const std::string tokens = dir_ + "/tokens";
  WriteAtomically(
      tokens, absl::StrCat(kAdminToken, " admin\n", kJobAToken, " job:a\n"));
  std::ofstream(dir_ + "/admin.token") << kAdminToken << "\n";
  std::ofstream(dir_ + "/a.token") << kJobAToken;
  auto server = AggregatorProcess::Start(
      dir_, {"--tls_cert=" + dir_ + "/server.crt",
             "--tls_key=" + dir_ + "/server.key",
             "--tls_client_ca=" + dir_ + "/ca.crt", "--tokens_file=" + tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions admin = Options((*server)->address());
  admin.tls_root_ca = *ReadPemFile(dir_ + "/ca.crt");
  admin.tls_client_cert = *ReadPemFile(dir_ + "/client.crt");
  admin.tls_client_key = *ReadPemFile(dir_ + "/client.key");
  admin.token = kAdminToken;
  ASSERT_TRUE(Client(admin).CreateJob(Job("a")).ok());
  ASSERT_TRUE(Client(admin).CreateJob(Job("b")).ok());

  const std::vector<std::string> tls = {
      "--server=" + (*server)->address(), "--timeout=3s",
      "--tls_ca=" + dir_ + "/ca.crt", "--tls_cert=" + dir_ + "/client.crt",
      "--tls_key=" + dir_ + "/client.key"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = tls;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  CtlRun jobs =
      Ctl(dir_, with({"--token_file=" + dir_ + "/admin.token", "jobs"}));
  EXPECT_EQ(jobs.code, 0) << jobs.err;
  EXPECT_TRUE(absl::StrContains(jobs.out, "a") &&
              absl::StrContains(jobs.out, "b"))
      << jobs.out;
  // A job's token reaches its job and no other.
  CtlRun own =
      Ctl(dir_, with({"--token_file=" + dir_ + "/a.token", "layers", "a"}));
  EXPECT_EQ(own.code, 0) << own.err;
  EXPECT_TRUE(absl::StrContains(own.out, "bn0")) << own.out;
  CtlRun other =
      Ctl(dir_, with({"--token_file=" + dir_ + "/a.token", "layers", "b"}));
  EXPECT_NE(other.code, 0);
  EXPECT_TRUE(absl::StrContains(other.err, "does not grant job 'b'"))
      << other.err;
  // No token, no certificate, a missing file: refused, each saying why;
  // the token never appears in what syncnormctl prints.
  CtlRun anonymous = Ctl(dir_, with({"jobs"}));
  EXPECT_NE(anonymous.code, 0);
  EXPECT_TRUE(absl::StrContains(anonymous.err, "token")) << anonymous.err;
  CtlRun no_cert = Ctl(dir_, {"--server=" + (*server)->address(),
                              "--timeout=3s", "--tls_ca=" + dir_ + "/ca.crt",
                              "--token_file=" + dir_ + "/admin.token", "jobs"});
  EXPECT_EQ(no_cert.code, 3) << no_cert.err;
  CtlRun missing = Ctl(dir_, with({"--token_file=" + dir_ + "/nope", "jobs"}));
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_TRUE(absl::StrContains(missing.err, dir_ + "/nope")) << missing.err;
  CtlRun half = Ctl(dir_, {"--server=" + (*server)->address(),
                           "--tls_cert=" + dir_ + "/client.crt", "jobs"});
  EXPECT_EQ(half.code, 2) << half.err;
  for (const CtlRun* r : {&jobs, &own, &other, &anonymous, &no_cert}) {
    EXPECT_FALSE(absl::StrContains(r->out + r->err, kAdminToken));
    EXPECT_FALSE(absl::StrContains(r->out + r->err, kJobAToken));
  }
  EXPECT_EQ((*server)->Stop().value_or(-1), 0);
}

class TokensTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    tokens_ = dir_ + "/tokens";
    WriteAtomically(
        tokens_, absl::StrCat("# test tokens\n", kAdminToken, " admin\n",
                              kJobAToken, " job:a\n", kJobBToken,
                              " job:b,job:c\n", kRelayToken, " relay,job:a\n"));
    auto server = AggregatorProcess::Start(dir_, {"--tokens_file=" + tokens_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  Client With(const std::string& token) {
    ClientOptions o = Options(server_->address());
    o.token = token;
    return Client(o);
  }

  // Waits until `call` gives `code`; the code it gave last.
  template <typename Call>
  absl::StatusCode Await(Call call, absl::StatusCode code) {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    absl::StatusCode got = call();
    while (got != code && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      got = call();
    }
    return got;
  }

  // No token value in the server's log.
  void ExpectNoTokenInLog() {
    const std::string log = ReadFile(dir_ + "/aggregator.log");
    for (const char* t :
         {kAdminToken, kJobAToken, kJobBToken, kLateToken, kRelayToken}) {
      EXPECT_FALSE(absl::StrContains(log, t)) << t << " in\n" << log;
    }
  }

  std::string tokens_;
  std::unique_ptr<AggregatorProcess> server_;
};

TEST_F(TokensTest, EveryCallNeedsATokenForItsJob) {
  Client none = With("");
  Client job_a = With(kJobAToken);
  Client admin = With(kAdminToken);

  absl::Status s = none.CreateJob(Job("a")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  s = With("wrong-token-0000000000000").CreateJob(Job("a")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  s = job_a.CreateJob(Job("b")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "job 'b'")) << s;

  ASSERT_TRUE(job_a.CreateJob(Job("a")).ok());
  ASSERT_TRUE(admin.CreateJob(Job("b")).ok());
  EXPECT_TRUE(job_a.GetJob("a").ok());
  EXPECT_EQ(job_a.GetJob("b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(job_a.DeleteJob("b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(job_a.Checkpoint("b", 0).status().code(),
            absl::StatusCode::kPermissionDenied);

  // Server-wide calls need admin.
  EXPECT_EQ(job_a.ListJobs().status().code(),
            absl::StatusCode::kPermissionDenied);
  auto jobs = admin.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 2u);
  // So do the backup calls (this server has no --backup_dir: admin passes
  // the check and hears that).
  EXPECT_EQ(none.Backup("b").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(job_a.Backup("b", "a").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(job_a.ListBackups().status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(job_a.RestoreBackup("b", "a").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(admin.Backup("b").status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Rounds: each contribution is checked, the refusal comes in-band.
  EXPECT_TRUE(OneRound(job_a, "a", 1).ok());
  EXPECT_TRUE(OneRound(admin, "a", 2).ok());
  EXPECT_EQ(OneRound(none, "a", 3).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(OneRound(job_a, "b", 1).code(),
            absl::StatusCode::kPermissionDenied);
  {
    // ReduceOnce too.
    auto channel = grpc::CreateChannel(server_->address(),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Aggregator::NewStub(channel);
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kJobBToken));
    v1::RoundResult result;
    grpc::Status st = stub->ReduceOnce(&context, Forward("a", 4, 0), &result);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    // Health stays open.
    EXPECT_EQ(CheckHealth(channel).value_or(-1), 1);
  }
  ExpectNoTokenInLog();
}

// A relay block vouches for its ranks' fingerprints: a trainer's job token
// may not send one, on a stream or unary; the relay's token (relay and
// the job) may, and only for its job.
TEST_F(TokensTest, ARelayBlockNeedsTheRelayScope) {
  ASSERT_TRUE(With(kAdminToken).CreateJob(Job("a", 2)).ok());
  auto block = [](int64_t step) {
    v1::Contribution c = Forward("a", step, 0);
    c.mutable_moments()->set_count(8);  // ranks 0 and 1, 4 samples each
    v1::RelayBlock* b = c.mutable_relay();
    b->set_first_position(0);
    b->set_positions(2);
    b->add_rank_runs(0);
    b->add_rank_runs(1);
    b->add_fingerprints(1);
    b->add_fingerprints(2);
    b->set_fingerprint_kind(2);
    return c;
  };
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Aggregator::NewStub(channel);
  const auto once = [&](const std::string& token, const v1::Contribution& c) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RoundResult result;
    return stub->ReduceOnce(&context, c, &result);
  };
  grpc::Status st = once(kJobAToken, block(1));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "'relay' or 'admin'"))
      << st.error_message();
  {
    // In-band on a stream, which stays usable.
    std::unique_ptr<Contributor> c = With(kJobAToken).NewContributor("a", 0);
    absl::StatusOr<v1::RoundResult> r = c->Round(block(1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
        << r.status();
  }
  // The relay's token: its block completes the round of both ranks.
  st = once(kRelayToken, block(1));
  EXPECT_TRUE(st.ok()) << st.error_message();
  v1::Contribution other_job = block(1);
  other_job.set_job_id("b");
  st = once(kRelayToken, other_job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ExpectNoTokenInLog();
}

// A round's age moves its deadline back: a rank's job token cannot say
// it (the round waits for the other rank as usual), the relay's can.
TEST_F(TokensTest, ARoundAgeCountsOnlyFromARelay) {
  ASSERT_TRUE(With(kAdminToken).CreateJob(Job("a", 2)).ok());
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials()));
  const auto once = [&](const std::string& token, const v1::Contribution& c,
                        grpc::Status* status) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RoundResult result;
    *status = stub->ReduceOnce(&context, c, &result);
  };
  v1::Contribution aged = Forward("a", 1, 0);
  aged.set_round_age_ms(3600 * 1000);  // past the 2 s timeout
  // From a rank: ignored, so rank 1 sent 300 ms later completes the round.
  grpc::Status first;
  std::thread rank0([&] { once(kJobAToken, aged, &first); });
  absl::SleepFor(absl::Milliseconds(300));
  grpc::Status second;
  once(kJobAToken, Forward("a", 1, 1), &second);
  rank0.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(second.ok()) << second.error_message();
  // From the relay: the round began a timeout ago, so it is overdue now.
  aged.set_step(2);
  const absl::Time start = absl::Now();
  grpc::Status relayed;
  once(kRelayToken, aged, &relayed);
  EXPECT_EQ(relayed.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << relayed.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // A negative age is refused, whoever sends it.
  aged.set_step(3);
  aged.set_round_age_ms(-1);
  grpc::Status negative;
  once(kRelayToken, aged, &negative);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(negative.error_message(), "round_age_ms -1"))
      << negative.error_message();
}

// Streams without a token in force end at once, UNAUTHENTICATED, before
// they count against --max_streams: four of them (two that send a
// contribution, two that send nothing) leave every slot to the admin.
TEST_F(SecurityTest, UnauthenticatedStreamsTakeNoSlot) {
  const std::string tokens = dir_ + "/tokens";
  WriteAtomically(tokens, absl::StrCat(kAdminToken, " admin\n"));
  auto server = AggregatorProcess::Start(
      dir_, {"--tokens_file=" + tokens, "--max_streams=4"});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions admin_options = Options((*server)->address());
  admin_options.token = kAdminToken;
  Client admin(admin_options);
  ASSERT_TRUE(admin.CreateJob(Job("a")).ok());

  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;
  grpc::ClientContext contexts[4];
  std::vector<std::unique_ptr<Stream>> strangers;
  for (int i = 0; i < 4; ++i) {
    contexts[i].set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (i == 1)
      contexts[i].AddMetadata("authorization", "Bearer not-a-token-00000000");
    strangers.push_back(stub->Reduce(&contexts[i]));
    if (i < 2) strangers.back()->Write(Forward("a", 1, 0));
  }
  const absl::Time start = absl::Now();
  for (auto& stream : strangers) {
    v1::RoundResult r;
    EXPECT_FALSE(stream->Read(&r)) << r.ShortDebugString();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << s.error_message();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "refused at once";

  // Every slot is free: the admin's streams, up to the limit, serve rounds.
  std::vector<std::unique_ptr<Contributor>> admins;
  for (int i = 0; i < 4; ++i) {
    admins.push_back(admin.NewContributor("a", 0));
    auto r = admins.back()->Round(Forward("a", 1 + i, 0));
    EXPECT_TRUE(r.ok()) << "stream " << i << ": " << r.status();
  }
}

// A connection whose calls keep being refused UNAUTHENTICATED (a client
// guessing tokens, or flooding without one) is closed after 64 of them;
// the client may reconnect, and other clients are served throughout.
TEST_F(TokensTest, AConnectionRefusedAgainAndAgainIsClosed) {
  Client admin = With(kAdminToken);
  ASSERT_TRUE(admin.CreateJob(Job("a")).ok());
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials()));
  int unauthenticated = 0, unavailable = 0;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    context.AddMetadata("authorization",
                        absl::StrCat("Bearer guess-", 1000000000 + i));
    v1::GetJobRequest request;
    request.set_job_id("a");
    v1::JobInfo info;
    const grpc::Status s = stub->GetJob(&context, request, &info);
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++unauthenticated;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) ++unavailable;
  }
  // 64 refusals close the connection; gRPC reconnects for the next calls.
  EXPECT_EQ(unauthenticated + unavailable, 100);
  EXPECT_GE(unauthenticated, 64);
  const std::string log = ReadFile(dir_ + "/aggregator.log");
  EXPECT_TRUE(absl::StrContains(log, "event=connection_closed")) << log;
  EXPECT_TRUE(absl::StrContains(log, "reason=unauthenticated")) << log;
  EXPECT_TRUE(admin.GetJob("a").ok());
  ExpectNoTokenInLog();
}

TEST_F(TokensTest, TheFileIsReloadedWhenItChanges) {
  Client late = With(kLateToken);
  Client admin = With(kAdminToken);
  ASSERT_TRUE(admin.CreateJob(Job("a")).ok());
  EXPECT_EQ(late.GetJob("a").status().code(),
            absl::StatusCode::kUnauthenticated);
  auto get_a = [&] { return late.GetJob("a").status().code(); };

  // Added: works within about a second.
  WriteAtomically(
      tokens_, absl::StrCat(kAdminToken, " admin\n", kLateToken, " job:a\n"));
  EXPECT_EQ(Await(get_a, absl::StatusCode::kOk), absl::StatusCode::kOk);
  // An open stream follows the file as well.
  std::unique_ptr<Contributor> stream = late.NewContributor("a", 0);
  EXPECT_TRUE(stream->Round(Forward("a", 1, 0)).ok());

  // A broken file keeps the tokens in force, and the log says so, naming
  // the line: here a line with its columns swapped, `job:<id> <token>`,
  // which must not put the token in the log (ExpectNoTokenInLog below).
  WriteAtomically(tokens_,
                  absl::StrCat(kLateToken, " job:a\n", "job:resnet50-run7 ",
                               kAdminToken, "\n"));
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_TRUE(late.GetJob("a").ok());
  const std::string log = ReadFile(dir_ + "/aggregator.log");
  EXPECT_TRUE(absl::StrContains(log, "level=error event=tokens_reload_failed"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "line 2: scope 1 of the second column"))
      << log;

  // Removed: refused within about a second, on the open stream too.
  WriteAtomically(tokens_, absl::StrCat(kAdminToken, " admin\n"));
  EXPECT_EQ(Await(get_a, absl::StatusCode::kUnauthenticated),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(stream->Round(Forward("a", 2, 0)).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(admin.GetJob("a").ok());
  ExpectNoTokenInLog();
}

TEST_F(SecurityTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  const std::string binary = Runfile("server/syncnorm-aggregator");
  const std::string log = dir_ + "/refused.log";
  for (const bool check_config : {false, true}) {
    std::vector<std::string> argv = {binary, "--listen=0.0.0.0:0",
                                     "--data_dir=" + dir_ + "/refused"};
    if (check_config) argv.push_back("--check_config");
    auto p = Subprocess::Spawn(argv, log);
    ASSERT_TRUE(p.ok());
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, check_config ? 2 : 1);
    EXPECT_TRUE(absl::StrContains(ReadFile(log), "--allow_insecure"))
        << ReadFile(log);
  }
  // Flags later on the command line win, so this listens on every address.
  auto server = AggregatorProcess::Start(
      dir_, {"--listen=0.0.0.0:0", "--allow_insecure"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Client(Options((*server)->address())).CreateJob(Job("x")).ok());
}

// Each limit: RESOURCE_EXHAUSTED naming its flag, and the server serves on.
class LimitsTest : public SecurityTest {
 protected:
  void Start(std::vector<std::string> flags) {
    auto server = AggregatorProcess::Start(dir_, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Aggregator::NewStub(channel_);
  }
  void ExpectLimit(const absl::Status& s, const std::string& flag) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "--" + flag + "=")) << s;
  }
  void ExpectStillServes() {
    Client client(Options(server_->address()));
    const std::string id = absl::StrCat("fine", ++fine_);
    ASSERT_TRUE(client.CreateJob(Job(id)).ok());
    EXPECT_TRUE(OneRound(client, id).ok());
    ASSERT_TRUE(client.DeleteJob(id).ok());
  }
  std::unique_ptr<AggregatorProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
  int fine_ = 0;
};

TEST_F(LimitsTest, JobsAndTheirSizesAndMessages) {
  Start({"--max_jobs=2", "--max_layers_per_job=2", "--max_channels=8",
         "--max_world_size=4", "--max_channels_per_job=16",
         "--max_message_bytes=65536"});
  Client client(Options(server_->address()));
  ExpectLimit(client.CreateJob(Job("w", 5)).status(), "max_world_size");
  ExpectStillServes();
  ExpectLimit(client.CreateJob(Job("l", 1, 3)).status(), "max_layers_per_job");
  ExpectStillServes();
  ExpectLimit(client.CreateJob(Job("c", 1, 1, 9)).status(), "max_channels");
  ExpectStillServes();
  v1::CreateJobRequest per_group = Job("cj", 4, 2, 8);  // 16 channels
  per_group.set_group_size(2);                          // 2 groups: 32
  ExpectLimit(client.CreateJob(per_group).status(), "max_channels_per_job");
  ExpectStillServes();
  ASSERT_TRUE(client.CreateJob(Job("j1")).ok());
  ASSERT_TRUE(client.CreateJob(Job("j2")).ok());
  ExpectLimit(client.CreateJob(Job("j3")).status(), "max_jobs");
  ASSERT_TRUE(client.DeleteJob("j2").ok());
  ExpectStillServes();

  // A message over --max_message_bytes (80 kB) is refused naming the flag
  // and the message's size; one over twice the limit (160 kB) by gRPC's
  // transport, whose message gives both sizes.
  {
    grpc::ClientContext context;
    v1::RoundResult result;
    grpc::Status s =
        stub_->ReduceOnce(&context, Forward("j1", 1, 0, 5000), &result);
    ExpectLimit(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                             s.error_message()),
                "max_message_bytes");
    EXPECT_TRUE(absl::StrContains(s.error_message(), "80"))
        << s.error_message();
  }
  {
    grpc::ClientContext context;
    v1::RoundResult result;
    grpc::Status s =
        stub_->ReduceOnce(&context, Forward("j1", 1, 0, 10000), &result);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "131072"))
        << s.error_message();
  }
  ASSERT_TRUE(client.DeleteJob("j1").ok());
  ExpectStillServes();
}

TEST_F(LimitsTest, RoundsInFlight) {
  Start({"--max_pending_rounds=2"});
  Client client(Options(server_->address()));
  ASSERT_TRUE(client.CreateJob(Job("p", 2)).ok());
  grpc::ClientContext context;
  auto stream = stub_->Reduce(&context);
  // Rank 0 of steps 1 and 2 wait for rank 1; step 3 would be a third round.
  for (int64_t step : {1, 2}) ASSERT_TRUE(stream->Write(Forward("p", step, 0)));
  absl::SleepFor(
      absl::Milliseconds(300));  // the server may take them in any order
  ASSERT_TRUE(stream->Write(Forward("p", 3, 0)));
  v1::RoundResult result;
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step(), 3) << result.ShortDebugString();
  ASSERT_TRUE(result.has_error());
  ExpectLimit(absl::Status(static_cast<absl::StatusCode>(result.error().code()),
                           result.error().message()),
              "max_pending_rounds");
  // Rank 1 completes step 2 (step 1 is superseded): room again.
  ASSERT_TRUE(stream->Write(Forward("p", 2, 1)));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(stream->Read(&result));
  ExpectStillServes();
  context.TryCancel();
}

TEST_F(LimitsTest, OpenStreams) {
  Start({"--max_streams=2"});
  Client client(Options(server_->address()));
  ASSERT_TRUE(client.CreateJob(Job("s")).ok());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<
      grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>>>
      streams;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub_->Reduce(contexts.back().get()));
    streams.back()->Write(Forward("s", 1 + i, 0));
    v1::RoundResult result;
    const bool read = streams.back()->Read(&result);
    if (i < 2) {
      ASSERT_TRUE(read);
      EXPECT_FALSE(result.has_error()) << result.error().message();
    } else {
      EXPECT_FALSE(read);
      grpc::Status s = streams.back()->Finish();
      ExpectLimit(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                               s.error_message()),
                  "max_streams");
    }
  }
  // One closes: a new stream fits again.
  contexts[0]->TryCancel();
  streams[0]->Finish();
  absl::SleepFor(absl::Milliseconds(200));
  ExpectStillServes();
}

// A stream idle past --stream_idle_timeout_ms ends UNAVAILABLE naming the
// flag, which frees its --max_streams slot; a stream in use, or waiting
// for its round, stays open; the client reopens by itself.
TEST_F(LimitsTest, IdleStreamsAreClosed) {
  Start({"--max_streams=2", "--stream_idle_timeout_ms=500"});
  Client client(Options(server_->address()));
  ASSERT_TRUE(client.CreateJob(Job("i")).ok());
  ASSERT_TRUE(client.CreateJob(Job("pair", 2)).ok());
  using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;
  auto open = [this](grpc::ClientContext& context) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Reduce(&context);
  };
  auto round = [](Stream& stream, const v1::Contribution& c) {
    v1::RoundResult r;
    return stream.Write(c) && stream.Read(&r) && !r.has_error();
  };
  grpc::ClientContext idle_context, busy_context;
  std::unique_ptr<Stream> idle = open(idle_context);
  std::unique_ptr<Stream> busy = open(busy_context);
  ASSERT_TRUE(round(*idle, Forward("i", 1, 0)));
  int64_t step = 2;
  // Rounds on `busy` every 150 ms for `d`: never idle for long.
  auto keep_busy = [&](absl::Duration d) {
    for (const absl::Time until = absl::Now() + d; absl::Now() < until;) {
      ASSERT_TRUE(round(*busy, Forward("i", step++, 0))) << "step " << step;
      absl::SleepFor(absl::Milliseconds(150));
    }
  };
  keep_busy(absl::Milliseconds(1500));
  v1::RoundResult r;
  EXPECT_FALSE(idle->Read(&r));
  const grpc::Status closed = idle->Finish();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::UNAVAILABLE)
      << closed.error_message();
  EXPECT_TRUE(
      absl::StrContains(closed.error_message(), "--stream_idle_timeout_ms=500"))
      << closed.error_message();

  // Its slot is free; a stream waiting for its round is not idle.
  grpc::ClientContext waiting_context;
  std::unique_ptr<Stream> waiting = open(waiting_context);
  ASSERT_TRUE(waiting->Write(Forward("pair", 1, 0)));
  keep_busy(absl::Milliseconds(1200));
  ASSERT_TRUE(round(*busy, Forward("pair", 1, 1)));
  ASSERT_TRUE(waiting->Read(&r));
  EXPECT_FALSE(r.has_error()) << r.error().message();

  // The client reopens a stream the server closed while it was idle.
  for (auto* context : {&busy_context, &waiting_context}) context->TryCancel();
  (void)busy->Finish();
  (void)waiting->Finish();
  absl::SleepFor(absl::Milliseconds(200));  // the server has let go of them
  std::unique_ptr<Contributor> contributor = client.NewContributor("i", 0);
  auto first = contributor->Round(Forward("i", 100, 0));
  EXPECT_TRUE(first.ok()) << first.status();
  absl::SleepFor(absl::Milliseconds(1200));
  auto second = contributor->Round(Forward("i", 101, 0));
  EXPECT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(absl::StrContains(ReadFile(dir_ + "/aggregator.log"),
                                "event=streams_idle_closed"));
}

}  // namespace
}  // namespace syncnorm
