// The relay attacked the way outsiders attack the aggregator, with small
// bounds, against an aggregator in this process: more streams than
// --max_streams (on their own connections), more ReduceOnce calls than
// --max_waiting_calls, messages over --max_message_bytes, a client that
// stops reading its answers, streams that stay idle or are abandoned with
// contributions held, unauthenticated floods. Each refusal is
// RESOURCE_EXHAUSTED (or UNAUTHENTICATED) naming its flag, what the relay
// holds stays within the bound docs/relay.md derives, and a legitimate
// rank's rounds complete throughout. Also: its health service and its
// metrics.
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "relay/relay_server.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "testing/local_aggregator.h"
#include "tests/testing/health.h"
#include "tests/testing/scrape.h"

namespace syncnorm {
namespace {

using Stub = v1::Aggregator::Stub;
using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;

// A channel of its own: a connection of its own.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                          int tag = 0) {
  static std::atomic<int> next{0};
  grpc::ChannelArguments args;
  args.SetInt("syncnorm.relay_bounds_test.connection", tag != 0 ? tag : ++next);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

absl::Status InBand(const v1::RoundResult& r) {
  if (!r.has_error()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.error().code()),
                      r.error().message());
}

// "" when `s` is RESOURCE_EXHAUSTED naming the relay's --flag=value; what
// is wrong otherwise.
std::string NamesLimit(const absl::Status& s, const std::string& flag,
                       int64_t value) {
  const std::string want = absl::StrCat("--", flag, "=", value);
  if (s.code() == absl::StatusCode::kResourceExhausted &&
      absl::StrContains(s.message(), want) &&
      absl::StrContains(s.message(), "relay's limit")) {
    return "";
  }
  return absl::StrCat("expected RESOURCE_EXHAUSTED naming the relay's ", want,
                      ", got ", s.ToString());
}

// Rank `rank`'s FORWARD of `step` with `channels` channels.
v1::Contribution Forward(const std::string& job, int rank, int64_t step,
                         int channels = 4) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(2 + rank);
  for (int ch = 0; ch < channels; ++ch) {
    c.mutable_moments()->add_mean(0.25 * ch - rank);
    c.mutable_moments()->add_m2(1.0 + 0.5 * rank + ch);
  }
  return c;
}

// One rank's Reduce stream on a connection of its own.
class RankStream {
 public:
  explicit RankStream(const std::string& address, const std::string& token = "")
      : stub_(v1::Aggregator::NewStub(NewChannel(address))) {
    if (!token.empty())
      context_.AddMetadata("authorization", "Bearer " + token);
    stream_ = stub_->Reduce(&context_);
  }
  ~RankStream() {
    context_.TryCancel();
    Finish().IgnoreError();
  }

  // Sends `c` and waits for its answer; the answer's status, or the
  // stream's when it ended.
  absl::Status Round(const v1::Contribution& c) {
    if (!stream_->Write(c)) return Finish();
    v1::RoundResult r;
    if (!stream_->Read(&r)) return Finish();
    return InBand(r);
  }
  bool Write(const v1::Contribution& c) { return stream_->Write(c); }
  bool Read(v1::RoundResult* r) { return stream_->Read(r); }
  // The stream's status, once it is over.
  absl::Status Finish() {
    if (!finished_) {
      finished_ = true;
      status_ = FromGrpc(stream_->Finish());
    }
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  std::unique_ptr<Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  bool finished_ = false;
  absl::Status status_;
};

// Polls `f` until true or `timeout`.
template <typename F>
bool Eventually(F f, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return f();
}

class RelayBoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::LocalAggregator>> aggregator =
        testing::LocalAggregator::Start();
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    shard_ = v1::Aggregator::NewStub(NewChannel(aggregator_->address()));
  }

  void StartRelay(RelayOptions options) {
    options.listen = "127.0.0.1:0";
    options.upstream = aggregator_->address();
    options.metrics_listen = "127.0.0.1:0";
    options.close_read_floods = false;  // in-process
    absl::StatusOr<std::unique_ptr<RelayServer>> relay =
        RelayServer::Start(options);
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = *std::move(relay);
    address_ = absl::StrCat("127.0.0.1:", relay_->port());
  }

  void CreateJob(const std::string& job, int world, int channels = 4,
                 int64_t timeout_ms = 20000) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.set_round_timeout_ms(timeout_ms);
    request.add_layers()->set_num_features(channels);
    grpc::ClientContext context;
    v1::JobInfo info;
    const grpc::Status s = shard_->CreateJob(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // A ReduceOnce through the relay on a connection of its own.
  absl::Status ReduceOnce(const v1::Contribution& c) {
    auto stub = v1::Aggregator::NewStub(NewChannel(address_));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::RoundResult r;
    return FromGrpc(stub->ReduceOnce(&context, c, &r));
  }

  RelayServiceCounters Service() const { return relay_->load().service; }

  std::unique_ptr<testing::LocalAggregator> aggregator_;
  std::unique_ptr<Stub> shard_;
  std::unique_ptr<RelayServer> relay_;
  std::string address_;
};

TEST_F(RelayBoundsTest, StreamsPastTheCapAreRefusedWhileARanksRoundsGoOn) {
  RelayOptions options;
  options.max_streams = 4;
  StartRelay(options);
  CreateJob("legit", 2);
  // The legitimate ranks' streams, opened first.
  RankStream rank0(address_);
  RankStream rank1(address_);
  auto round = [&](int64_t step) {
    absl::Status s0;
    std::thread t([&] { s0 = rank0.Round(Forward("legit", 0, step)); });
    const absl::Status s1 = rank1.Round(Forward("legit", 1, step));
    t.join();
    EXPECT_TRUE(s0.ok()) << s0;
    EXPECT_TRUE(s1.ok()) << s1;
  };
  round(0);
  // A flood of streams, each on a connection of its own: two take the
  // slots left (and read nothing: they hold them), every other one is
  // refused naming the flag.
  constexpr int kExhausted =
      static_cast<int>(absl::StatusCode::kResourceExhausted);
  std::vector<std::unique_ptr<RankStream>> flood;
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    const int64_t refused_before = Service().refusals[kExhausted];
    const int64_t open_before = Service().open_streams;
    flood.push_back(std::make_unique<RankStream>(address_));
    ASSERT_TRUE(Eventually([&] {
      return Service().open_streams > open_before ||
             Service().refusals[kExhausted] > refused_before;
    }));
    if (Service().refusals[kExhausted] > refused_before) {
      EXPECT_EQ(NamesLimit(flood.back()->Finish(), "max_streams", 4), "");
      ++refused;
    }
  }
  EXPECT_EQ(refused, 10);
  EXPECT_EQ(Service().open_streams, 4);
  // The legitimate ranks' rounds go on.
  for (int64_t step = 1; step <= 3; ++step) round(step);
  // The flood gone, its slots come back.
  flood.clear();
  ASSERT_TRUE(Eventually([&] { return Service().open_streams == 2; }))
      << Service().open_streams;
  RankStream late(address_);
  CreateJob("solo", 1);
  EXPECT_TRUE(late.Round(Forward("solo", 0, 0)).ok());
}

TEST_F(RelayBoundsTest, AConnectionOpensNoMoreStreamsThanAdvertised) {
  RelayOptions options;
  options.max_streams_per_connection = 3;
  StartRelay(options);
  CreateJob("c", 2);
  // Six streams on one connection: gRPC's client queues those past the
  // relay's advertised limit, so the relay holds three.
  class Opener
      : public grpc::ClientBidiReactor<v1::Contribution, v1::RoundResult> {
   public:
    explicit Opener(Stub& stub) {
      stub.async()->Reduce(&context_, this);
      StartCall();
    }
    void OnDone(const grpc::Status&) override { done_.Notify(); }
    void Cancel() { context_.TryCancel(); }
    bool Done() {
      return done_.WaitForNotificationWithTimeout(absl::Seconds(10));
    }

   private:
    grpc::ClientContext context_;
    absl::Notification done_;
  };
  auto stub = v1::Aggregator::NewStub(NewChannel(address_));
  std::vector<std::unique_ptr<Opener>> streams;
  for (int i = 0; i < 6; ++i)
    streams.push_back(std::make_unique<Opener>(*stub));
  ASSERT_TRUE(Eventually([&] { return Service().open_streams == 3; }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Service().open_streams, 3);
  // Another connection is served.
  CreateJob("solo", 1);
  RankStream other(address_);
  EXPECT_TRUE(other.Round(Forward("solo", 0, 0)).ok());
  for (auto& s : streams) s->Cancel();
  for (auto& s : streams) EXPECT_TRUE(s->Done());
}

TEST_F(RelayBoundsTest, MessagesOverTheBoundAreRefusedNamingTheFlag) {
  constexpr int64_t kMax = 64 << 10;
  RelayOptions options;
  options.max_message_bytes = kMax;
  options.max_transport_bytes = 8 << 20;
  StartRelay(options);
  CreateJob("big", 1, 6000);
  // 6,000 channels: 96 kB, over the bound but under gRPC's ceiling (twice
  // it): the relay reads it and refuses it in-band, naming the flag.
  RankStream stream(address_);
  const absl::Status in_band = stream.Round(Forward("big", 0, 0, 6000));
  EXPECT_EQ(NamesLimit(in_band, "max_message_bytes", kMax), "");
  EXPECT_EQ(NamesLimit(ReduceOnce(Forward("big", 0, 0, 6000)),
                       "max_message_bytes", kMax),
            "");
  // Over the ceiling: gRPC's own refusal, and the relay serves on.
  const absl::Status cut = ReduceOnce(Forward("big", 0, 0, 12000));
  EXPECT_EQ(cut.code(), absl::StatusCode::kResourceExhausted) << cut;
  CreateJob("small", 1, 1000);
  EXPECT_TRUE(stream.Round(Forward("small", 0, 0, 1000)).ok());
  EXPECT_TRUE(ReduceOnce(Forward("small", 0, 1, 1000)).ok());
  // Nothing of the refused ones went up.
  EXPECT_EQ(relay_->load().upstream.calls[UpstreamCounters::kReduceOnce], 2);
}

TEST_F(RelayBoundsTest, AClientThatStopsReadingHoldsNoMoreThanItsBound) {
  constexpr int64_t kMax = 256 << 10;
  constexpr int kChannels = 8000;  // 128 kB a message, each way
  RelayOptions options;
  options.max_message_bytes = kMax;
  StartRelay(options);
  CreateJob("slow", 1, kChannels);
  CreateJob("legit", 1);
  // Writes round after round of its own job (each answered at once by the
  // shard) and reads none of the answers; its receive window stays gRPC's
  // initial one.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = v1::Aggregator::NewStub(grpc::CreateCustomChannel(
      address_, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = stub->Reduce(&context);
  std::atomic<int> written{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int64_t step = 0; step < 400 && !stop.load(); ++step) {
      if (!stream->Write(Forward("slow", 0, step, kChannels))) break;
      written.fetch_add(1);
    }
  });
  // A legitimate rank beside it, and the most the relay held.
  RankStream legit(address_);
  int64_t peak = 0;
  int64_t step = 0;
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    EXPECT_TRUE(legit.Round(Forward("legit", 0, step++)).ok());
    peak = std::max(peak, Service().held_bytes);
    absl::SleepFor(absl::Milliseconds(5));
  }
  const int64_t read_then = Service().contributions;
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t read_later = Service().contributions;
  // Reads stopped: the stream holds its bound (4 x --max_message_bytes),
  // give or take the message read last and an answer.
  EXPECT_EQ(read_later, read_then);
  EXPECT_LT(read_then, 400 + step);
  EXPECT_GE(peak, kHeldMessagesPerStream * kMax / 2) << "the flood held little";
  EXPECT_LE(peak, kHeldMessagesPerStream * kMax + 2 * kMax);
  // The client goes away: what the relay held goes with it.
  stop.store(true);
  context.TryCancel();
  writer.join();
  stream->Finish();
  EXPECT_TRUE(Eventually([&] { return Service().held_bytes == 0; }))
      << Service().held_bytes;
  EXPECT_TRUE(Eventually([&] { return Service().open_streams == 1; }));
}

TEST_F(RelayBoundsTest, ReduceOnceCallsPastTheCapAreRefused) {
  RelayOptions options;
  options.max_waiting_calls = 3;
  StartRelay(options);
  CreateJob("w", 2);
  // Rank 0's calls wait in their block for rank 1.
  auto stub = v1::Aggregator::NewStub(NewChannel(address_));
  struct Call {
    grpc::ClientContext context;
    v1::Contribution request;
    v1::RoundResult result;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int64_t step = 0; step < 3; ++step) {
    calls.push_back(std::make_unique<Call>());
    Call* c = calls.back().get();
    c->request = Forward("w", 0, step);
    stub->async()->ReduceOnce(&c->context, &c->request, &c->result,
                              [c](grpc::Status s) {
                                c->status = std::move(s);
                                c->done.Notify();
                              });
  }
  ASSERT_TRUE(Eventually([&] { return Service().waiting_calls == 3; }));
  EXPECT_EQ(NamesLimit(ReduceOnce(Forward("w", 0, 3)), "max_waiting_calls", 3),
            "");
  // Rank 1 comes on a stream: the blocks complete, the calls are answered.
  RankStream rank1(address_);
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_TRUE(rank1.Round(Forward("w", 1, step)).ok());
  }
  for (auto& c : calls) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
  }
  EXPECT_TRUE(Eventually([&] { return Service().waiting_calls == 0; }));
  CreateJob("solo", 1);
  EXPECT_TRUE(ReduceOnce(Forward("solo", 0, 0)).ok());
}

TEST_F(RelayBoundsTest, IdleStreamsEndAndFreeTheirSlot) {
  RelayOptions options;
  options.max_streams = 1;
  options.stream_idle_timeout = absl::Milliseconds(300);
  StartRelay(options);
  CreateJob("solo", 1);
  RankStream stream(address_);
  ASSERT_TRUE(stream.Round(Forward("solo", 0, 0)).ok());
  v1::RoundResult r;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(stream.Read(&r));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const absl::Status s = stream.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--stream_idle_timeout_ms=300"))
      << s;
  ASSERT_TRUE(Eventually([&] { return Service().open_streams == 0; }));
  EXPECT_EQ(Service().idle_streams_closed, 1);
  RankStream next(address_);
  EXPECT_TRUE(next.Round(Forward("solo", 0, 1)).ok());
}

TEST_F(RelayBoundsTest, AnAbandonedStreamKeepsItsSlotWhileItsRoundIsHeld) {
  RelayOptions options;
  options.max_streams = 1;
  StartRelay(options);
  CreateJob("w", 2);
  {
    // Rank 0's contribution waits in its block; then its client goes.
    RankStream gone(address_);
    ASSERT_TRUE(gone.Write(Forward("w", 0, 0)));
    ASSERT_TRUE(
        Eventually([&] { return relay_->counters().open_blocks == 1; }));
    gone.Cancel();
  }
  // What the relay holds of it keeps the slot: another stream is refused.
  absl::SleepFor(absl::Milliseconds(100));
  {
    RankStream refused(address_);
    v1::RoundResult r;
    EXPECT_FALSE(refused.Read(&r));
    EXPECT_EQ(NamesLimit(refused.Finish(), "max_streams", 1), "");
  }
  EXPECT_GT(Service().held_bytes, 0);
  // Rank 1 completes the block; the answer to the gone stream goes nowhere
  // and its slot comes back.
  EXPECT_TRUE(ReduceOnce(Forward("w", 1, 0)).ok());
  ASSERT_TRUE(Eventually([&] { return Service().open_streams == 0; }));
  EXPECT_EQ(Service().held_bytes, 0);
  CreateJob("solo", 1);
  RankStream next(address_);
  EXPECT_TRUE(next.Round(Forward("solo", 0, 0)).ok());
}

TEST_F(RelayBoundsTest, UnauthenticatedCallsTakeNoSlotAndLoseTheirConnection) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/relay_bounds_tokens");
  const std::string token = "token-of-job-solo-0123456789";
  {
    std::ofstream out(path);
    out << token << " job:solo\n";
  }
  RelayOptions options;
  options.max_streams = 1;
  options.tokens_file = path;
  StartRelay(options);
  CreateJob("solo", 1);
  // One connection sends stream after stream without a token: each ends
  // UNAUTHENTICATED without a slot, and past the guard's line (64, as the
  // aggregator's) the connection is closed.
  auto stub = v1::Aggregator::NewStub(NewChannel(address_));
  int unauthenticated = 0;
  for (int i = 0; i < 80; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    auto stream = stub->Reduce(&context);
    v1::RoundResult r;
    stream->Read(&r);
    if (stream->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      ++unauthenticated;
    }
  }
  EXPECT_GE(unauthenticated, 64);
  EXPECT_TRUE(Eventually([&] {
    return relay_->load().connections_closed[static_cast<int>(
               CloseReason::kUnauthenticated)] >= 1;
  }));
  EXPECT_EQ(Service().open_streams, 0);
  // The one slot is free for a rank with a token.
  RankStream rank(address_, token);
  EXPECT_TRUE(rank.Round(Forward("solo", 0, 0)).ok());
}

// Every method but the rounds is answered UNIMPLEMENTED, naming the
// shards; a connection that keeps calling them is closed at the guard's
// line (64, reason unimplemented: once in 80 calls, the channel
// reconnecting after it), and a rank's rounds go on.
TEST_F(RelayBoundsTest,
       CallsOfMethodsARelayLacksAreRefusedAndCloseTheirConnection) {
  StartRelay(RelayOptions());
  CreateJob("solo", 1);
  auto stub = v1::Aggregator::NewStub(NewChannel(address_));
  int unimplemented = 0;
  std::string message;
  for (int i = 0; i < 80; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetJobRequest request;
    request.set_job_id("solo");
    v1::JobInfo info;
    const grpc::Status s = stub->GetJob(&context, request, &info);
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      ++unimplemented;
      message = s.error_message();
    }
  }
  EXPECT_GE(unimplemented, 64);
  EXPECT_NE(message.find("send GetJob to the aggregator shards"),
            std::string::npos)
      << message;
  EXPECT_TRUE(Eventually([&] {
    return relay_->load().connections_closed[static_cast<int>(
               CloseReason::kUnimplemented)] == 1;
  }));
  RankStream rank(address_);
  EXPECT_TRUE(rank.Round(Forward("solo", 0, 0)).ok());
}

TEST_F(RelayBoundsTest, HealthIsServingUntilShutdown) {
  StartRelay(RelayOptions());
  auto channel = NewChannel(address_);
  EXPECT_EQ(testing::CheckHealth(channel, "").value_or(-1), 1);
  EXPECT_EQ(
      testing::CheckHealth(channel, "syncnorm.v1.Aggregator").value_or(-1), 1);
  // A Watch sees SERVING, then NOT_SERVING when the relay shuts down.
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  grpc::health::v1::HealthCheckRequest request;
  auto watch = health->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  std::thread stop([&] { relay_->Shutdown(absl::Seconds(2)); });
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  context.TryCancel();
  watch->Finish();
  stop.join();
}

TEST_F(RelayBoundsTest, ShutdownEndsStreamsUnavailableOnceAnswered) {
  StartRelay(RelayOptions());
  CreateJob("solo", 1);
  RankStream stream(address_);
  ASSERT_TRUE(stream.Round(Forward("solo", 0, 0)).ok());
  std::thread stop([&] { relay_->Shutdown(absl::Seconds(5)); });
  v1::RoundResult r;
  EXPECT_FALSE(stream.Read(&r));
  const absl::Status s = stream.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "shutting down")) << s;
  stop.join();
}

TEST_F(RelayBoundsTest, MetricsCountRoundsRefusalsAndCalls) {
  RelayOptions options;
  options.max_message_bytes = 64 << 10;
  options.max_transport_bytes = 8 << 20;
  StartRelay(options);
  ASSERT_GT(relay_->metrics_port(), 0);
  CreateJob("block", 8);
  CreateJob("solo", 1);
  // One block of 8 ranks, merged; one rank alone, passed through; one
  // message over the bound, refused.
  std::vector<std::unique_ptr<RankStream>> ranks;
  for (int r = 0; r < 8; ++r) {
    ranks.push_back(std::make_unique<RankStream>(address_));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r) {
    threads.emplace_back(
        [&, r] { EXPECT_TRUE(ranks[r]->Round(Forward("block", r, 0)).ok()); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(ReduceOnce(Forward("solo", 0, 0)).ok());
  EXPECT_FALSE(ReduceOnce(Forward("solo", 0, 1, 6000)).ok());

  // Once gRPC is done with the calls.
  std::string text;
  EXPECT_TRUE(Eventually([&] {
    text = testing::ScrapeMetrics(relay_->metrics_port());
    return testing::HandledCalls(text, "ReduceOnce") == 2 &&
           testing::Sample(text, "syncnorm_relay_waiting_calls") == 0;
  })) << text;
  auto sample = [&](const std::string& series) {
    return testing::Sample(text, series).value_or(-1);
  };
  EXPECT_EQ(sample("syncnorm_relay_contributions_total"), 10) << text;
  EXPECT_EQ(sample("syncnorm_relay_blocks_forwarded_total"), 1);
  EXPECT_EQ(
      sample("syncnorm_relay_passed_through_total{reason=\"not_mergeable\"}"),
      1);
  EXPECT_EQ(
      sample("syncnorm_relay_passed_through_total{reason=\"incomplete\"}"), 0);
  EXPECT_EQ(sample("syncnorm_relay_answers_total{code=\"OK\"}"), 9);
  EXPECT_EQ(
      sample("syncnorm_relay_refusals_total{code=\"RESOURCE_EXHAUSTED\"}"), 1);
  EXPECT_EQ(
      sample("syncnorm_relay_upstream_calls_total{method=\"ReduceOnce\"}"), 2);
  // One per job, and a reread by a block that waited past
  // --job_refresh_ms (a slow machine's).
  EXPECT_GE(sample("syncnorm_relay_upstream_calls_total{method=\"GetJob\"}"),
            2);
  EXPECT_EQ(sample("syncnorm_relay_upstream_retries_total"), 0);
  EXPECT_EQ(sample("syncnorm_relay_block_rounds"), 0);
  EXPECT_EQ(sample("syncnorm_relay_jobs"), 2);
  EXPECT_EQ(sample("syncnorm_relay_open_streams"), 8);
  EXPECT_EQ(sample("syncnorm_relay_waiting_calls"), 0);
  EXPECT_EQ(sample("syncnorm_relay_held_bytes"), 0);
  EXPECT_EQ(sample("syncnorm_relay_limit{flag=\"max_streams\"}"), 64);
  EXPECT_EQ(sample("syncnorm_relay_limit{flag=\"max_message_bytes\"}"),
            64 << 10);
  EXPECT_EQ(
      sample("syncnorm_relay_connections_closed_total{reason=\"rapid_reset\"}"),
      0);
  EXPECT_GE(sample("syncnorm_relay_grpc_calls"), 8);
  // gRPC's server metrics: the streams report themselves, the rest
  // through the interceptor.
  EXPECT_EQ(testing::HandledCalls(text, "ReduceOnce"), 2) << text;
  EXPECT_TRUE(absl::StrContains(
      text, "grpc_server_started_total{grpc_method=\"Reduce\""))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "process_resident_memory_bytes"));
  EXPECT_TRUE(absl::StrContains(text, "syncnorm_relay_build_info{version="));
}

}  // namespace
}  // namespace syncnorm
