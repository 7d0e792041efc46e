// The service over a real channel: the generated stub against an in-process
// Server on 127.0.0.1:0.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "kernels/formulas.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/stream_set.h"
#include "server/server.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

void SetDeadline(grpc::ClientContext& ctx,
                 absl::Duration d = absl::Seconds(10)) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::ToInt64Milliseconds(d)));
}

v1::CreateJobRequest JobRequest(const std::string& id, int world, int channels,
                                int layers = 1, int64_t timeout_ms = 5000) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(world);
  r.set_round_timeout_ms(timeout_ms);
  for (int i = 0; i < layers; ++i) {
    v1::LayerSpec* l = r.add_layers();
    l->set_name("bn" + std::to_string(i));
    l->set_num_features(channels);
  }
  return r;
}

v1::Contribution Fwd(const std::string& job, int layer, int64_t step, int rank,
                     int64_t count, std::vector<double> mean,
                     std::vector<double> m2) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(layer);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(count);
  for (double v : mean) c.mutable_moments()->add_mean(v);
  for (double v : m2) c.mutable_moments()->add_m2(v);
  return c;
}

v1::Contribution Bwd(const std::string& job, int layer, int64_t step, int rank,
                     std::vector<double> dy, std::vector<double> dy_xmu) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(layer);
  c.set_step(step);
  c.set_phase(v1::BACKWARD);
  c.set_rank(rank);
  for (double v : dy) c.mutable_grad_sums()->add_sum_dy(v);
  for (double v : dy_xmu) c.mutable_grad_sums()->add_sum_dy_xmu(v);
  return c;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.round_timeout = absl::Seconds(5);
    options.data_dir = "";  // in memory; tests/ covers the durable store
    server_ = std::make_unique<Server>(options);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->bound_port(), 0);
    channel_ = grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->bound_port()),
        grpc::InsecureChannelCredentials());
    stub_ = v1::Aggregator::NewStub(channel_);
  }

  void TearDown() override {
    server_->Shutdown(absl::Seconds(1));
    server_->Wait();
  }

  grpc::Status CreateJob(const v1::CreateJobRequest& r,
                         v1::JobInfo* info = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::JobInfo local;
    return stub_->CreateJob(&ctx, r, info ? info : &local);
  }

  grpc::Status ReduceOnce(const v1::Contribution& c,
                          v1::RoundResult* result = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::RoundResult local;
    return stub_->ReduceOnce(&ctx, c, result ? result : &local);
  }

  // grpc.health.v1.Health/Check for the whole server, through a generic
  // call: the request is empty, the response is field 1 (status) as varint.
  int HealthStatus() {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    grpc::ByteBuffer request, response;
    grpc::Slice empty("", 0);
    request = grpc::ByteBuffer(&empty, 1);
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                      &request, &response, [&](grpc::Status s) {
                        status = s;
                        done.Notify();
                      });
    done.WaitForNotification();
    if (!status.ok()) return -1;
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return -1;
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (bytes.size() != 2 || bytes[0] != 0x08) return -1;
    return bytes[1];
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

// A unary call through gRPC's generic stub, the request as raw bytes: what
// any client sees of the answer, trailers included.
grpc::Status GenericCall(grpc::Channel* channel, const std::string& method,
                         const std::string& request) {
  grpc::GenericStub generic(
      std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&ctx, method, grpc::StubOptions(), &in, &out,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  return status;
}

// Whether `s` carries, as grpc-status-details-bin, a google.rpc.Status of
// its own code and message: read by protobuf's own wire parser (field 1
// the code, field 2 the message), not by the server's encoder.
::testing::AssertionResult HasStatusDetails(const grpc::Status& s) {
  if (s.error_details().empty()) {
    return ::testing::AssertionFailure()
           << "no grpc-status-details-bin on " << s.error_code() << " "
           << s.error_message();
  }
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(s.error_details())) {
    return ::testing::AssertionFailure() << "details do not parse";
  }
  int64_t code = -1;
  std::string message;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() == 1 &&
        f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      code = static_cast<int64_t>(f.varint());
    } else if (f.number() == 2 &&
               f.type() ==
                   google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      message = f.length_delimited();
    }
  }
  if (code != s.error_code() || message != s.error_message()) {
    return ::testing::AssertionFailure()
           << "details say " << code << " '" << message << "', the status "
           << s.error_code() << " '" << s.error_message() << "'";
  }
  return ::testing::AssertionSuccess();
}

// Every error the server answers carries its status as details, health's
// included; the one error of these that gRPC makes itself, UNIMPLEMENTED
// for a method the server does not have, carries none.
TEST_F(ServiceTest, EveryErrorOfTheServerCarriesItsStatusAsDetails) {
  // grpc.health.v1.HealthCheckRequest { service = 1 } and
  // syncnorm.v1.GetJobRequest { job_id = 1 }, encoded by hand.
  auto field1 = [](const std::string& text) {
    return std::string(1, '\x0a') + static_cast<char>(text.size()) + text;
  };
  grpc::Status health =
      GenericCall(channel_.get(), "/grpc.health.v1.Health/Check",
                  field1("no.such.Service"));
  EXPECT_EQ(health.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(health.error_message(), HasSubstr("no.such.Service"));
  EXPECT_TRUE(HasStatusDetails(health));
  grpc::Status job = GenericCall(
      channel_.get(), "/syncnorm.v1.Aggregator/GetJob", field1("absent"));
  EXPECT_EQ(job.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(HasStatusDetails(job));
  grpc::Status unknown =
      GenericCall(channel_.get(), "/syncnorm.v1.Aggregator/NoSuchMethod", "");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(unknown.error_details().empty());
  // Bytes that are not a GetJobRequest (a field 1 longer than the message)
  // are refused by gRPC's C++ library before the server sees the call.
  grpc::Status garbled =
      GenericCall(channel_.get(), "/syncnorm.v1.Aggregator/GetJob", "\x0a\x7f");
  EXPECT_EQ(garbled.error_code(), grpc::StatusCode::INTERNAL)
      << garbled.error_message();
  EXPECT_TRUE(garbled.error_details().empty());
}

// A health Watch that the server's shutdown ends gets UNAVAILABLE with
// details: the server's answer, not a connection gRPC lost.
TEST(ServerTest, AWatchEndedByShutdownCarriesItsStatusAsDetails) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = "";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server.bound_port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto watch = health->Watch(&ctx, grpc::health::v1::HealthCheckRequest());
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  std::thread stop([&] { server.Shutdown(absl::Seconds(5)); });
  while (watch->Read(&response)) {
  }
  grpc::Status ended = watch->Finish();
  stop.join();
  server.Wait();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE)
      << ended.error_message();
  EXPECT_TRUE(HasStatusDetails(ended));
}

TEST_F(ServiceTest, CreateJobIsIdempotentAndReportsDefaults) {
  v1::CreateJobRequest r = JobRequest("idem", 2, 3);
  r.mutable_layers(0)->set_momentum_mode(v1::MOMENTUM_DECAY);
  v1::JobInfo first, second;
  ASSERT_TRUE(CreateJob(r, &first).ok());
  EXPECT_EQ(first.group_size(), 2);
  EXPECT_EQ(first.committed_step(), -1);
  EXPECT_EQ(first.layers(0).momentum(), 0.9);
  EXPECT_EQ(first.layers(0).initial_running_var_size(), 3);
  ASSERT_TRUE(CreateJob(r, &second).ok());
  EXPECT_EQ(first.SerializeAsString(), second.SerializeAsString());
  // The returned JobInfo, sent back as a spec, is the same job.
  v1::CreateJobRequest echoed = r;
  *echoed.mutable_layers() = first.layers();
  EXPECT_TRUE(CreateJob(echoed).ok());
  r.set_world_size(4);
  grpc::Status diff = CreateJob(r);
  EXPECT_EQ(diff.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(diff.error_message(), HasSubstr("different spec"));
  grpc::ClientContext ctx;
  v1::GetJobRequest get;
  get.set_job_id("idem");
  v1::JobInfo got;
  ASSERT_TRUE(stub_->GetJob(&ctx, get, &got).ok());
  EXPECT_EQ(got.world_size(), 2);
}

// Long-double reference of a global batch from raw data.
struct Ref {
  long double n = 0, mean = 0, m2 = 0;
};

TEST_F(ServiceTest, ThreeRanksForwardAndBackwardOverStreams) {
  const int world = 3, channels = 2;
  ASSERT_TRUE(CreateJob(JobRequest("e2e", world, channels)).ok());
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(1.0, 2.0);
  const int counts[world] = {4, 0, 9};
  std::vector<std::vector<std::vector<double>>> data(world);  // [rank][c][i]
  for (int r = 0; r < world; ++r) {
    data[r].resize(channels);
    for (int c = 0; c < channels; ++c) {
      for (int i = 0; i < counts[r]; ++i) data[r][c].push_back(normal(rng));
    }
  }
  std::vector<Ref> ref(channels);
  for (int c = 0; c < channels; ++c) {
    long double sum = 0;
    for (int r = 0; r < world; ++r) {
      for (double x : data[r][c]) sum += x, ref[c].n += 1;
    }
    ref[c].mean = sum / ref[c].n;
    for (int r = 0; r < world; ++r) {
      for (double x : data[r][c]) {
        ref[c].m2 += (x - ref[c].mean) * (x - ref[c].mean);
      }
    }
  }
  std::vector<v1::RoundResult> forward(world), backward(world);
  std::vector<grpc::Status> finals(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::vector<double> mean(channels, 0), m2(channels, 0);
      for (int c = 0; c < channels; ++c) {
        double n = 0;
        for (double x : data[r][c]) WelfordAdd(n, mean[c], m2[c], x);
      }
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      auto stream = stub_->Reduce(&ctx);
      ASSERT_TRUE(stream->Write(Fwd("e2e", 0, 0, r, counts[r], mean, m2)));
      ASSERT_TRUE(stream->Read(&forward[r]));
      ASSERT_TRUE(
          stream->Write(Bwd("e2e", 0, 0, r, {1.0 * r, 0.5}, {0.25, -1.0 * r})));
      ASSERT_TRUE(stream->Read(&backward[r]));
      stream->WritesDone();
      finals[r] = stream->Finish();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(finals[r].ok()) << finals[r].error_message();
    const v1::RoundResult& f = forward[r];
    ASSERT_TRUE(f.has_moments()) << f.DebugString();
    EXPECT_EQ(f.job_id(), "e2e");
    EXPECT_EQ(f.phase(), v1::FORWARD);
    EXPECT_EQ(f.version(), 1);
    EXPECT_EQ(f.moments().count(), 13);
    for (int c = 0; c < channels; ++c) {
      EXPECT_NEAR(f.moments().mean(c), static_cast<double>(ref[c].mean), 1e-12);
      EXPECT_NEAR(f.moments().var(c), static_cast<double>(ref[c].m2 / ref[c].n),
                  1e-12);
      EXPECT_EQ(f.moments().mean(c), forward[0].moments().mean(c));
    }
    const v1::RoundResult& b = backward[r];
    ASSERT_TRUE(b.has_grad_sums()) << b.DebugString();
    EXPECT_EQ(b.phase(), v1::BACKWARD);
    EXPECT_EQ(b.version(), 1);
    EXPECT_EQ(b.grad_sums().sum_dy(0), 3.0);
    EXPECT_EQ(b.grad_sums().sum_dy(1), 1.5);
    EXPECT_EQ(b.grad_sums().sum_dy_xmu(0), 0.75);
    EXPECT_EQ(b.grad_sums().sum_dy_xmu(1), -3.0);
  }
  grpc::ClientContext ctx;
  v1::GetRunningStatsRequest req;
  req.set_job_id("e2e");
  v1::RunningStats stats;
  ASSERT_TRUE(stub_->GetRunningStats(&ctx, req, &stats).ok());
  EXPECT_EQ(stats.step(), 0);
  ASSERT_EQ(stats.layers_size(), 1);
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 1);
  for (int c = 0; c < channels; ++c) {
    const long double want_mean = 0.1L * ref[c].mean;
    const long double want_var = 0.9L + 0.1L * ref[c].m2 / (ref[c].n - 1);
    EXPECT_NEAR(stats.layers(0).running_mean(c), (double)want_mean, 1e-12);
    EXPECT_NEAR(stats.layers(0).running_var(c), (double)want_var, 1e-12);
  }
}

// A client that sends without waiting for answers (a generic client, or
// one that pipelines its layers' rounds) has its contributions taken in
// the order it sent them, as a gRPC stream promises: a later step of a
// layer never reaches the aggregator first, where it would complete and
// make the earlier step stale. Many steps back to back, one rank.
TEST_F(ServiceTest, AStreamsContributionsAreTakenInTheOrderSent) {
  constexpr int kSteps = 2000;
  ASSERT_TRUE(CreateJob(JobRequest("order", 1, 4, 1, 20000)).ok());
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Seconds(60));
  auto stream = stub_->Reduce(&ctx);
  std::vector<v1::RoundResult> answers;
  std::thread reader([&] {
    v1::RoundResult r;
    while (static_cast<int>(answers.size()) < kSteps && stream->Read(&r)) {
      answers.push_back(r);
    }
  });
  for (int step = 1; step <= kSteps; ++step) {
    const double x = 0.5 * step;
    ASSERT_TRUE(stream->Write(
        Fwd("order", 0, step, 0, 2, {x, -x, 1, 2}, {1, 2, 3, 4})));
  }
  reader.join();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answers.size(), static_cast<size_t>(kSteps));
  int refused = 0;
  for (const v1::RoundResult& r : answers) {
    if (r.has_error()) {
      if (++refused <= 3) ADD_FAILURE() << r.DebugString();
      continue;
    }
    // One rank: the global moments are its own, var = m2 / count.
    const double x = 0.5 * r.step();
    EXPECT_EQ(r.moments().count(), 2);
    EXPECT_EQ(r.moments().mean(0), x);
    EXPECT_EQ(r.moments().mean(1), -x);
    EXPECT_EQ(r.moments().var(3), 2.0);
  }
  EXPECT_EQ(refused, 0) << "contributions refused out of " << kSteps;
}

// A client may need its next message read before its last one can be
// answered. Rank 0 sends layer 0, then layer 1, then reads; rank 1 sends
// layer 1, waits for its answer, then sends layer 0. Layer 1's round needs
// rank 0's second message while its first waits for layer 0's round. A
// stream that holds back its next read until its answer (to save a
// packet) must post it in time, and read eagerly once it sees this:
// otherwise both rounds wait for the round timeout (or forever).
TEST_F(ServiceTest, AStreamWhoseRoundNeedsItsNextMessageReadsItInTime) {
  constexpr int kSteps = 20;
  ASSERT_TRUE(CreateJob(JobRequest("cross", 2, 2, 2)).ok());
  // Rank r's layer l at step s: count 2, mean (x, -x), M2 (1, 3).
  auto x = [](int r, int l, int s) { return 0.25 * s + 2.0 * l + 8.0 * r; };
  auto contribution = [&](int r, int l, int s) {
    return Fwd("cross", l, s, r, 2, {x(r, l, s), -x(r, l, s)}, {1.0, 3.0});
  };
  std::vector<v1::RoundResult> answers[2];
  const absl::Time start = absl::Now();
  std::thread rank1([&] {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(30));
    auto stream = stub_->Reduce(&ctx);
    v1::RoundResult r;
    for (int s = 0; s < kSteps; ++s) {
      for (int l : {1, 0}) {
        ASSERT_TRUE(stream->Write(contribution(1, l, s)));
        ASSERT_TRUE(stream->Read(&r));
        answers[1].push_back(r);
      }
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  });
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(30));
    auto stream = stub_->Reduce(&ctx);
    v1::RoundResult r;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(stream->Write(contribution(0, 0, s)));
      ASSERT_TRUE(stream->Write(contribution(0, 1, s)));
      for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(stream->Read(&r));
        answers[0].push_back(r);
      }
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  rank1.join();
  const absl::Duration took = absl::Now() - start;
  // A read held back is posted within 10 ms, once; the round timeout is
  // 5 s.
  EXPECT_LT(took, absl::Seconds(2));
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(answers[rank].size(), 2u * kSteps);
    for (const v1::RoundResult& r : answers[rank]) {
      ASSERT_TRUE(r.has_moments())
          << "rank " << rank << ": " << r.DebugString();
      // Two ranks of 2 samples: the mean is the means' average; M2 adds
      // (x0 - x1)^2 * 2 * 2 / 4 to the two M2s.
      const double x0 = x(0, r.layer(), r.step());
      const double x1 = x(1, r.layer(), r.step());
      const double between = (x0 - x1) * (x0 - x1);
      EXPECT_EQ(r.moments().count(), 4);
      EXPECT_EQ(r.moments().mean(0), (x0 + x1) / 2);
      EXPECT_EQ(r.moments().mean(1), -(x0 + x1) / 2);
      EXPECT_DOUBLE_EQ(r.moments().var(0), (2.0 + between) / 4);
      EXPECT_DOUBLE_EQ(r.moments().var(1), (6.0 + between) / 4);
    }
  }
}

TEST_F(ServiceTest, ReduceOnceAnswersAndReturnsFailuresAsStatus) {
  ASSERT_TRUE(CreateJob(JobRequest("once", 1, 1)).ok());
  v1::RoundResult result;
  ASSERT_TRUE(ReduceOnce(Fwd("once", 0, 3, 0, 2, {1.5}, {0.5}), &result).ok());
  EXPECT_EQ(result.step(), 3);
  EXPECT_EQ(result.moments().count(), 2);
  EXPECT_EQ(result.moments().var(0), 0.25);
  EXPECT_EQ(result.version(), 1);
  // A retry gets the same answer.
  v1::RoundResult again;
  ASSERT_TRUE(ReduceOnce(Fwd("once", 0, 3, 0, 2, {1.5}, {0.5}), &again).ok());
  EXPECT_EQ(again.SerializeAsString(), result.SerializeAsString());

  ASSERT_TRUE(CreateJob(JobRequest("once-late", 3, 1, 1, 200)).ok());
  grpc::Status late = ReduceOnce(Fwd("once-late", 0, 0, 1, 2, {1}, {1}));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(late.error_message(),
              HasSubstr("missed its 200 ms deadline waiting for ranks [0, 2]"));
}

// Job W=1024, rank 0 alone: the round's deadline error names 1,023
// missing ranks. Its message and details (metadata, base64 on the wire)
// stay small, so that a client with gRPC's default 8 KiB metadata limit
// gets the deadline and not RESOURCE_EXHAUSTED; the stream's answer lists
// every missing rank in its field.
TEST_F(ServiceTest, AWideRoundsDeadlineErrorStaysSmall) {
  constexpr int kWorld = 1024;
  ASSERT_TRUE(CreateJob(JobRequest("wide", kWorld, 1, 1, 200)).ok());
  std::vector<int> others;  // every rank but 0
  for (int r = 1; r < kWorld; ++r) others.push_back(r);

  const grpc::Status once = ReduceOnce(Fwd("wide", 0, 0, 0, 2, {1}, {1}));
  EXPECT_EQ(once.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << once.error_message().size()
      << " bytes: " << once.error_message().substr(0, 200);
  EXPECT_LE(once.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_LE(once.error_details().size(), kMaxStatusMessageBytes + 16);
  EXPECT_THAT(once.error_message(), HasSubstr("waiting for ranks [1-1023]"));

  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto stream = stub_->Reduce(&ctx);
  v1::RoundResult r;
  ASSERT_TRUE(stream->Write(Fwd("wide", 0, 1, 0, 2, {1}, {1})));
  ASSERT_TRUE(stream->Read(&r));
  ASSERT_TRUE(r.has_error()) << r.ShortDebugString().substr(0, 200);
  EXPECT_EQ(r.error().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LE(r.error().message().size(), kMaxStatusMessageBytes);
  EXPECT_THAT(r.error().message(), HasSubstr("waiting for ranks [1-1023]"));
  EXPECT_EQ(std::vector<int>(r.error().missing_ranks().begin(),
                             r.error().missing_ranks().end()),
            others);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// A held read is released while the stream's answer comes and its next
// contribution holds the read again. The release then ends that second
// hold: the stream must leave the set's held streams with it. One left
// there behind a stream that ends is touched by the set's next release
// after the stream is freed (caught by ASan in CI).
TEST_F(ServiceTest, AReadReleasedAsItIsHeldAgainLeavesNoStaleHold) {
  ASSERT_TRUE(CreateJob(JobRequest("rehold", 2, 2)).ok());
  auto contribution = [](int rank, int step) {
    return Fwd("rehold", 0, step, rank, 2, {1.0 * rank, 2.0}, {1.0, 1.0});
  };
  absl::Notification releasing, held_again, released;
  int held_after_release = -1;
  StreamSet::SetReleaseHooksForTest(
      [&](StreamSet& set) {
        if (releasing.HasBeenNotified()) return;
        releasing.Notify();
        // The answer and the next contribution come meanwhile.
        held_again.WaitForNotification();
        while (set.held_for_test() == 0) absl::SleepFor(absl::Milliseconds(1));
      },
      [&](StreamSet& set) {
        if (released.HasBeenNotified()) return;
        held_after_release = set.held_for_test();
        released.Notify();
      });
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto stream = stub_->Reduce(&ctx);
  v1::RoundResult r;
  // Step 0 waits for rank 1: its read is held, then taken for release.
  ASSERT_TRUE(stream->Write(contribution(0, 0)));
  releasing.WaitForNotification();
  v1::RoundResult once;
  {
    grpc::ClientContext c;
    SetDeadline(c);
    ASSERT_TRUE(stub_->ReduceOnce(&c, contribution(1, 0), &once).ok());
  }
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.step(), 0);
  // Step 1 waits too: the read is held again, before the release runs.
  ASSERT_TRUE(stream->Write(contribution(0, 1)));
  held_again.Notify();
  released.WaitForNotification();
  StreamSet::SetReleaseHooksForTest(nullptr, nullptr);
  EXPECT_EQ(held_after_release, 0) << "a stream's read released while held "
                                      "again stays in the held set";
  {
    grpc::ClientContext c;
    SetDeadline(c);
    ASSERT_TRUE(stub_->ReduceOnce(&c, contribution(1, 1), &once).ok());
  }
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.step(), 1);
  ASSERT_TRUE(r.has_moments()) << r.DebugString();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServiceTest, InBandErrorKeepsTheStreamUsable) {
  ASSERT_TRUE(CreateJob(JobRequest("inband", 1, 2)).ok());
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto stream = stub_->Reduce(&ctx);
  v1::RoundResult r;
  ASSERT_TRUE(stream->Write(Fwd("inband", 0, 0, 0, 2, {1, 2, 3}, {0, 0, 0})));
  ASSERT_TRUE(stream->Read(&r));
  ASSERT_TRUE(r.has_error()) << r.DebugString();
  EXPECT_EQ(r.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.error().message(),
              HasSubstr("has 3 values but the layer has 2"));
  EXPECT_EQ(r.job_id(), "inband");
  ASSERT_TRUE(stream->Write(Fwd("nope", 0, 0, 0, 2, {1, 2}, {0, 0})));
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.error().code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(stream->Write(Fwd("inband", 0, 0, 0, 2, {1, 2}, {0.5, 0.5})));
  ASSERT_TRUE(stream->Read(&r));
  ASSERT_TRUE(r.has_moments()) << r.DebugString();
  EXPECT_EQ(r.moments().mean(1), 2.0);
  EXPECT_EQ(r.version(), 1);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Reduce streams carry raw bytes that the server parses itself: a message
// that is no Contribution ends the stream with a status that says so, once
// what came before it is answered.
TEST_F(ServiceTest, AReduceMessageThatIsNoContributionEndsItsStream) {
  ASSERT_TRUE(CreateJob(JobRequest("raw", 1, 2)).ok());
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto call = generic.PrepareCall(&ctx, "/syncnorm.v1.Aggregator/Reduce", &cq);
  auto wait = [&cq](int expected) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(expected));
    return ok;
  };
  auto bytes = [](const std::string& s) {
    grpc::Slice slice(s);
    return grpc::ByteBuffer(&slice, 1);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait(1));
  const grpc::ByteBuffer good =
      bytes(Fwd("raw", 0, 0, 0, 2, {1, 2}, {0, 0}).SerializeAsString());
  call->Write(good, reinterpret_cast<void*>(2));
  ASSERT_TRUE(wait(2));
  grpc::ByteBuffer answer;
  call->Read(&answer, reinterpret_cast<void*>(3));
  ASSERT_TRUE(wait(3));
  v1::RoundResult r;
  ASSERT_TRUE(
      grpc::SerializationTraits<v1::RoundResult>::Deserialize(&answer, &r)
          .ok());
  EXPECT_TRUE(r.has_moments()) << r.DebugString();
  // Field 1 (job_id) said to be 16 bytes long, and 2 follow: it parses as
  // nothing.
  const grpc::ByteBuffer bad =
      bytes(std::string("\x0a\x10"
                        "ab",
                        4));
  call->Write(bad, reinterpret_cast<void*>(4));
  wait(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait(5);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("no syncnorm.v1.Contribution"));
}

TEST_F(ServiceTest, BadRequestsGetPreciseStatuses) {
  ASSERT_TRUE(CreateJob(JobRequest("table", 2, 2, 2)).ok());
  ASSERT_TRUE(CreateJob(JobRequest("solo", 1, 1)).ok());
  ASSERT_TRUE(ReduceOnce(Fwd("solo", 0, 5, 0, 2, {0}, {1})).ok());
  using Code = grpc::StatusCode;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto create = [this](std::function<void(v1::CreateJobRequest&)> mutate) {
    return [this, mutate] {
      v1::CreateJobRequest r = JobRequest("new-job", 2, 2);
      mutate(r);
      return CreateJob(r);
    };
  };
  auto reduce = [this](std::function<void(v1::Contribution&)> mutate) {
    return [this, mutate] {
      v1::Contribution c = Fwd("table", 0, 0, 0, 2, {0, 0}, {1, 1});
      mutate(c);
      return ReduceOnce(c);
    };
  };
  struct Case {
    std::string name;
    std::function<grpc::Status()> call;
    Code code;
  };
  std::vector<Case> cases = {
      {"empty job id", create([](auto& r) { r.set_job_id(""); }),
       Code::INVALID_ARGUMENT},
      {"bad job id", create([](auto& r) { r.set_job_id("a b"); }),
       Code::INVALID_ARGUMENT},
      {"world 0", create([](auto& r) { r.set_world_size(0); }),
       Code::INVALID_ARGUMENT},
      {"no layers", create([](auto& r) { r.clear_layers(); }),
       Code::INVALID_ARGUMENT},
      {"group 3 of 2", create([](auto& r) { r.set_group_size(3); }),
       Code::INVALID_ARGUMENT},
      {"num_features 0",
       create([](auto& r) { r.mutable_layers(0)->set_num_features(0); }),
       Code::INVALID_ARGUMENT},
      {"momentum 2",
       create([](auto& r) { r.mutable_layers(0)->set_momentum(2); }),
       Code::INVALID_ARGUMENT},
      {"initial mean size", create([](auto& r) {
         r.mutable_layers(0)->add_initial_running_mean(1);
       }),
       Code::INVALID_ARGUMENT},
      {"respec table", create([](auto& r) { r.set_job_id("table"); }),
       Code::ALREADY_EXISTS},
      {"get unknown",
       [this] {
         grpc::ClientContext ctx;
         v1::GetJobRequest r;
         r.set_job_id("ghost");
         v1::JobInfo info;
         return stub_->GetJob(&ctx, r, &info);
       },
       Code::NOT_FOUND},
      {"delete unknown",
       [this] {
         grpc::ClientContext ctx;
         v1::DeleteJobRequest r;
         r.set_job_id("ghost");
         v1::DeleteJobResponse resp;
         return stub_->DeleteJob(&ctx, r, &resp);
       },
       Code::NOT_FOUND},
      {"reduce unknown job", reduce([](auto& c) { c.set_job_id("ghost"); }),
       Code::NOT_FOUND},
      {"layer 2 of 2", reduce([](auto& c) { c.set_layer(2); }),
       Code::INVALID_ARGUMENT},
      {"rank 2 of 2", reduce([](auto& c) { c.set_rank(2); }),
       Code::INVALID_ARGUMENT},
      {"negative step", reduce([](auto& c) { c.set_step(-1); }),
       Code::INVALID_ARGUMENT},
      {"phase unspecified",
       reduce([](auto& c) { c.set_phase(v1::PHASE_UNSPECIFIED); }),
       Code::INVALID_ARGUMENT},
      {"no payload", reduce([](auto& c) { c.clear_moments(); }),
       Code::INVALID_ARGUMENT},
      {"backward with moments",
       reduce([](auto& c) { c.set_phase(v1::BACKWARD); }),
       Code::INVALID_ARGUMENT},
      {"wrong channels",
       reduce([](auto& c) { c.mutable_moments()->add_mean(0); }),
       Code::INVALID_ARGUMENT},
      {"negative count",
       reduce([](auto& c) { c.mutable_moments()->set_count(-1); }),
       Code::INVALID_ARGUMENT},
      {"nan mean",
       reduce([nan](auto& c) { c.mutable_moments()->set_mean(0, nan); }),
       Code::INVALID_ARGUMENT},
      {"negative m2",
       reduce([](auto& c) { c.mutable_moments()->set_m2(1, -0.5); }),
       Code::INVALID_ARGUMENT},
      {"stale step",
       [this] { return ReduceOnce(Fwd("solo", 0, 5 - 1, 0, 2, {0}, {1})); },
       Code::FAILED_PRECONDITION},
      {"conflicting retry",
       [this] { return ReduceOnce(Fwd("solo", 0, 5, 0, 2, {7}, {1})); },
       Code::ABORTED},
      {"stats of a checkpoint",
       [this] {
         grpc::ClientContext ctx;
         v1::GetRunningStatsRequest r;
         r.set_job_id("table");
         r.set_checkpoint_step(3);
         v1::RunningStats s;
         return stub_->GetRunningStats(&ctx, r, &s);
       },
       Code::NOT_FOUND},
      {"stats of group 1",
       [this] {
         grpc::ClientContext ctx;
         v1::GetRunningStatsRequest r;
         r.set_job_id("table");
         r.set_group(1);
         v1::RunningStats s;
         return stub_->GetRunningStats(&ctx, r, &s);
       },
       Code::INVALID_ARGUMENT},
      {"checkpoint",
       [this] {
         grpc::ClientContext ctx;
         SetDeadline(ctx, absl::Milliseconds(500));
         v1::CheckpointRequest r;
         r.set_job_id("table");
         v1::CheckpointInfo info;
         return stub_->Checkpoint(&ctx, r, &info);
       },
       Code::DEADLINE_EXCEEDED},
      {"checkpoint of a negative step",
       [this] {
         grpc::ClientContext ctx;
         v1::CheckpointRequest r;
         r.set_job_id("table");
         r.set_step(-1);
         v1::CheckpointInfo info;
         return stub_->Checkpoint(&ctx, r, &info);
       },
       Code::INVALID_ARGUMENT},
      {"checkpoint of an unknown job",
       [this] {
         grpc::ClientContext ctx;
         v1::CheckpointRequest r;
         r.set_job_id("nope");
         v1::CheckpointInfo info;
         return stub_->Checkpoint(&ctx, r, &info);
       },
       Code::NOT_FOUND},
      {"restore",
       [this] {
         grpc::ClientContext ctx;
         v1::RestoreCheckpointRequest r;
         r.set_job_id("table");
         v1::JobInfo info;
         return stub_->RestoreCheckpoint(&ctx, r, &info);
       },
       Code::NOT_FOUND},
      {"import of a wrong channel count",
       [this] {
         grpc::ClientContext ctx;
         v1::SetRunningStatsRequest r;
         r.set_job_id("table");
         r.add_layers()->add_running_mean(1.0);
         v1::RunningStats s;
         return stub_->SetRunningStats(&ctx, r, &s);
       },
       Code::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    grpc::Status s = c.call();
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << c.name;
  }
  // The server still serves, and nothing was counted in "table".
  EXPECT_EQ(HealthStatus(), 1);  // SERVING
  v1::JobInfo info;
  ASSERT_TRUE(CreateJob(JobRequest("after-table", 1, 1), &info).ok());
  grpc::ClientContext ctx;
  v1::GetRunningStatsRequest r;
  r.set_job_id("table");
  v1::RunningStats s;
  ASSERT_TRUE(stub_->GetRunningStats(&ctx, r, &s).ok());
  EXPECT_EQ(s.layers(0).num_batches_tracked(), 0);
  EXPECT_EQ(s.step(), -1);
}

TEST_F(ServiceTest, CancelledAndDeletedCallsDoNotHurtTheServer) {
  ASSERT_TRUE(CreateJob(JobRequest("cancel", 2, 1, 1, 300)).ok());
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    auto stream = stub_->Reduce(&ctx);
    ASSERT_TRUE(stream->Write(Fwd("cancel", 0, 0, 0, 2, {1}, {1})));
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Milliseconds(50));
    grpc::Status s;
    v1::RoundResult r;
    s = stub_->ReduceOnce(&ctx, Fwd("cancel", 0, 1, 0, 2, {1}, {1}), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // A stream waiting on a job that gets deleted hears ABORTED in-band.
  ASSERT_TRUE(CreateJob(JobRequest("doomed", 2, 1)).ok());
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto stream = stub_->Reduce(&ctx);
  ASSERT_TRUE(stream->Write(Fwd("doomed", 0, 0, 0, 2, {1}, {1})));
  absl::SleepFor(absl::Milliseconds(100));
  {
    grpc::ClientContext del_ctx;
    v1::DeleteJobRequest del;
    del.set_job_id("doomed");
    v1::DeleteJobResponse resp;
    ASSERT_TRUE(stub_->DeleteJob(&del_ctx, del, &resp).ok());
  }
  v1::RoundResult r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.error().code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(r.error().message(), HasSubstr("job deleted"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  absl::SleepFor(absl::Milliseconds(400));  // let the cancelled rounds expire
  EXPECT_EQ(HealthStatus(), 1);
  EXPECT_TRUE(CreateJob(JobRequest("still-alive", 1, 1)).ok());
}

TEST(ServerTest, ShutdownEndsWaitingCallsAndReportsNotServing) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = "";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_FALSE(server.Start().ok());
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server.bound_port()),
                          grpc::InsecureChannelCredentials());
  auto stub = v1::Aggregator::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::JobInfo info;
    ASSERT_TRUE(stub->CreateJob(&ctx, JobRequest("wait", 2, 1), &info).ok());
  }
  grpc::Status once_status;
  std::thread waiter([&] {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::RoundResult r;
    once_status = stub->ReduceOnce(&ctx, Fwd("wait", 0, 0, 0, 2, {1}, {1}), &r);
  });
  grpc::ClientContext stream_ctx;
  SetDeadline(stream_ctx);
  auto stream = stub->Reduce(&stream_ctx);
  ASSERT_TRUE(stream->Write(Fwd("wait", 0, 1, 1, 2, {1}, {1})));
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  server.Shutdown(absl::Milliseconds(200));
  server.Wait();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(once_status.ok());
  EXPECT_FALSE(stream->Finish().ok());
}

TEST(ServerTest, UnbindableAddressIsUnavailable) {
  ServerOptions options;
  options.listen = "256.1.1.1:99999";
  options.allow_insecure = true;  // past the loopback-only rule, to bind
  options.data_dir = "";
  Server server(options);
  absl::Status s = server.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(server.bound_port(), 0);
}

// The backup calls through gRPC: each bad request its status, with a
// message that says what to do.
TEST(ServerTest, BackupCallsRefuseWhatTheyCannotDoAndSayWhy) {
  const std::string dir = ::testing::TempDir() + "/service_test_backups";
  std::filesystem::remove_all(dir);
  struct Case {
    std::string data_dir, backup_dir;
    grpc::StatusCode code;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "", grpc::StatusCode::FAILED_PRECONDITION, "no --backup_dir"},
           {"", dir + "/b1", grpc::StatusCode::FAILED_PRECONDITION,
            "keeps its state in memory"},
           {dir + "/data", dir + "/b2", grpc::StatusCode::OK, ""},
       }) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.data_dir = c.data_dir;
    options.backup_dir = c.backup_dir;
    Server server(options);
    ASSERT_TRUE(server.Start().ok());
    auto stub = v1::Aggregator::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server.bound_port()),
                            grpc::InsecureChannelCredentials()));
    auto backup = [&](const std::string& name, int shard) {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::BackupRequest r;
      r.set_name(name);
      r.set_shard(shard);
      v1::BackupInfo info;
      return stub->Backup(&ctx, r, &info);
    };
    grpc::Status s = backup("nightly", 0);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr(c.says));
    if (c.code != grpc::StatusCode::OK) continue;
    EXPECT_EQ(backup("nightly", 0).error_code(),
              grpc::StatusCode::ALREADY_EXISTS);
    s = backup("../../etc", 0);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("[A-Za-z0-9._-]"));
    EXPECT_EQ(backup("ok", -1).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::BackupRequest r;
      r.set_job_id("no-such-job");
      v1::BackupInfo info;
      EXPECT_EQ(stub->Backup(&ctx, r, &info).error_code(),
                grpc::StatusCode::NOT_FOUND);
    }
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::ListBackupsResponse list;
      ASSERT_TRUE(
          stub->ListBackups(&ctx, v1::ListBackupsRequest(), &list).ok());
      ASSERT_EQ(list.backups_size(), 1);
      EXPECT_EQ(list.backups(0).name(), "nightly");
    }
    for (const auto& [name, code] :
         std::vector<std::pair<std::string, grpc::StatusCode>>{
             {"../nightly", grpc::StatusCode::INVALID_ARGUMENT},
             {"never-made", grpc::StatusCode::NOT_FOUND},
             {"nightly", grpc::StatusCode::OK}}) {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::RestoreBackupRequest r;
      r.set_name(name);
      v1::RestoreBackupResponse response;
      EXPECT_EQ(stub->RestoreBackup(&ctx, r, &response).error_code(), code)
          << name;
    }
    server.Shutdown(absl::Seconds(1));
    server.Wait();
  }
}

// A damaged backup through gRPC: a MANIFEST or CURRENT deleted is
// DATA_LOSS (a generic client does not retry it), with details, naming the
// backup; the job that the restore would have replaced is untouched.
TEST(ServerTest, RestoreOfADamagedBackupIsDataLossAndChangesNothing) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/service_test_damaged";
  fs::remove_all(dir);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir + "/data";
  options.backup_dir = dir + "/backups";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server.bound_port()),
                          grpc::InsecureChannelCredentials()));
  auto round = [&](int64_t step, double mean) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::RoundResult result;
    return stub->ReduceOnce(
        &ctx, Fwd("kept", 0, step, 0, 4, {mean, -mean}, {3, 5}), &result);
  };
  auto stats = [&] {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::GetRunningStatsRequest r;
    r.set_job_id("kept");
    v1::RunningStats s;
    EXPECT_TRUE(stub->GetRunningStats(&ctx, r, &s).ok());
    return s.SerializeAsString();
  };
  auto restore = [&](const std::string& name) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::RestoreBackupRequest r;
    r.set_name(name);
    r.set_replace(true);
    v1::RestoreBackupResponse response;
    return stub->RestoreBackup(&ctx, r, &response);
  };
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::JobInfo info;
    ASSERT_TRUE(stub->CreateJob(&ctx, JobRequest("kept", 1, 2), &info).ok());
  }
  ASSERT_TRUE(round(0, 1.5).ok());
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::BackupRequest r;
    r.set_name("b");
    v1::BackupInfo info;
    ASSERT_TRUE(stub->Backup(&ctx, r, &info).ok());
  }
  ASSERT_TRUE(round(1, -2.5).ok());
  const std::string live = stats();
  for (const std::string prefix : {"MANIFEST-", "CURRENT"}) {
    const std::string name = "without-" + prefix.substr(0, 7);
    fs::create_directories(dir + "/backups/" + name);
    fs::copy(dir + "/backups/b/shard-0", dir + "/backups/" + name + "/shard-0",
             fs::copy_options::recursive);
    int removed = 0;
    for (const auto& e :
         fs::directory_iterator(dir + "/backups/" + name + "/shard-0")) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) {
        removed += fs::remove(e.path());
      }
    }
    ASSERT_EQ(removed, 1) << prefix;
    grpc::Status s = restore(name);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS)
        << prefix << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(name));
    EXPECT_TRUE(HasStatusDetails(s));
    EXPECT_EQ(stats(), live) << prefix;
  }
  // The whole backup does restore, and moves the job back.
  ASSERT_TRUE(restore("b").ok());
  EXPECT_NE(stats(), live);
  server.Shutdown(absl::Seconds(1));
  server.Wait();
}

}  // namespace
}  // namespace syncnorm
