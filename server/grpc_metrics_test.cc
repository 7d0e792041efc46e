// The gRPC metrics of a real in-process Server, scraped from its metrics
// endpoint: every call is counted once, with the status its client got,
// also when gRPC cut it short or the service refused it at once.
#include "server/metrics/grpc_metrics.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/scrape.h"

namespace syncnorm {
namespace {

using ::syncnorm::testing::HandledCalls;
using ::syncnorm::testing::ScrapeMetrics;

using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;

constexpr int kMaxStreams = 2;

v1::Contribution Forward(const std::string& job, int64_t step, int rank) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(2);
  for (double v : {1.0, 2.0}) c.mutable_moments()->add_mean(v);
  for (double v : {1.0, 1.0}) c.mutable_moments()->add_m2(v);
  return c;
}

class GrpcMetricsTest : public ::testing::Test {
 protected:
  // An in-memory server with metrics and `max_streams`, and job "j" of two
  // ranks.
  void Start(int max_streams) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.data_dir = "";
    options.metrics_listen = "127.0.0.1:0";
    options.round_timeout = absl::Seconds(30);
    options.limits.max_streams = max_streams;
    server_ = std::make_unique<Server>(options);
    ASSERT_TRUE(server_->Start().ok());
    stub_ = v1::Aggregator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->bound_port()),
                            grpc::InsecureChannelCredentials()));
    v1::CreateJobRequest job;
    job.set_job_id("j");
    job.set_world_size(2);
    v1::LayerSpec* layer = job.add_layers();
    layer->set_name("bn");
    layer->set_num_features(2);
    grpc::ClientContext context;
    v1::JobInfo info;
    ASSERT_TRUE(stub_->CreateJob(&context, job, &info).ok());
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    server_->Shutdown(absl::Seconds(1));
    server_->Wait();
  }

  // The metrics once `method` has `calls` handled calls (all codes), or
  // after 10 s: a call is counted once it is over on the server, which may
  // be a moment after its client has its status.
  std::string MetricsOnceHandled(const std::string& method, double calls) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::string text = ScrapeMetrics(server_->metrics_port());
    while (HandledCalls(text, method, "") < calls && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      text = ScrapeMetrics(server_->metrics_port());
    }
    return text;
  }

  // A stream the server has taken: it answered a contribution (in-band
  // NOT_FOUND).
  std::unique_ptr<Stream> OpenStream(grpc::ClientContext& context) {
    std::unique_ptr<Stream> stream = stub_->Reduce(&context);
    v1::RoundResult r;
    EXPECT_TRUE(stream->Write(Forward("nope", 0, 0)) && stream->Read(&r));
    EXPECT_EQ(r.error().code(), grpc::StatusCode::NOT_FOUND);
    return stream;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

// A stream whose client goes away: its reads fail and the service ends it
// OK, but the client never gets that OK.
TEST_F(GrpcMetricsTest, CancelledStreamsCountAsCanceled) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_streams=*/0));
  constexpr int kStreams = 20;
  for (int i = 0; i < kStreams; ++i) {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = OpenStream(context);
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const std::string text = MetricsOnceHandled("Reduce", kStreams);
  EXPECT_EQ(HandledCalls(text, "Reduce", "Canceled"), kStreams) << text;
  EXPECT_EQ(HandledCalls(text, "Reduce", "OK"), 0) << text;
}

// The service answers CANCELLED when the call is cancelled; its client got
// DEADLINE_EXCEEDED. (The client's cancellation at its deadline may reach
// the server just before the server's own deadline: a deadline well above
// kDeadlineSkew keeps that case apart from an early cancellation.)
TEST_F(GrpcMetricsTest, CallWhoseDeadlinePassedCountsDeadlineExceeded) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_streams=*/0));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(1000));
  v1::RoundResult r;
  EXPECT_EQ(stub_->ReduceOnce(&context, Forward("j", 1, 0), &r).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  const std::string text = MetricsOnceHandled("ReduceOnce", 1);
  EXPECT_EQ(HandledCalls(text, "ReduceOnce", "DeadlineExceeded"), 1) << text;
  EXPECT_EQ(HandledCalls(text, "ReduceOnce", ""), 1) << text;
}

// A stream over --max_streams, refused at once, and streams that end well.
TEST_F(GrpcMetricsTest, RefusedAndCompletedStreamsCountTheirStatus) {
  ASSERT_NO_FATAL_FAILURE(Start(kMaxStreams));
  grpc::ClientContext contexts[kMaxStreams];
  std::vector<std::unique_ptr<Stream>> open;
  for (grpc::ClientContext& c : contexts) open.push_back(OpenStream(c));
  {
    grpc::ClientContext context;
    std::unique_ptr<Stream> refused = stub_->Reduce(&context);
    v1::RoundResult r;
    refused->Write(Forward("nope", 0, 0));
    EXPECT_FALSE(refused->Read(&r));
    EXPECT_EQ(refused->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  for (auto& stream : open) {
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  const std::string text = MetricsOnceHandled("Reduce", kMaxStreams + 1);
  EXPECT_EQ(HandledCalls(text, "Reduce", "ResourceExhausted"), 1) << text;
  EXPECT_EQ(HandledCalls(text, "Reduce", "OK"), kMaxStreams) << text;
  EXPECT_EQ(HandledCalls(text, "Reduce", ""), kMaxStreams + 1) << text;
}

// Unary calls answered at once: the status the service sent.
TEST_F(GrpcMetricsTest, AnsweredCallsCountTheStatusSent) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_streams=*/0));
  for (const char* id : {"j", "nope"}) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::JobInfo info;
    (void)stub_->GetJob(&context, request, &info);
  }
  const std::string text = MetricsOnceHandled("GetJob", 2);
  EXPECT_EQ(HandledCalls(text, "GetJob", "OK"), 1) << text;
  EXPECT_EQ(HandledCalls(text, "GetJob", "NotFound"), 1) << text;
}

}  // namespace
}  // namespace syncnorm
