// Memory under abuse, as tests/flood_test.cc attacks the aggregator: the
// relay binary with small bounds, in front of the aggregator binary, is
// flooded within its bounds and beyond them (every stream slot taken by
// clients that write and never read, more streams than --max_streams,
// ReduceOnce calls parked past --max_waiting_calls, messages over
// --max_message_bytes and over gRPC's ceiling, raw HTTP/2 rapid resets).
// Every refusal names its flag, a legitimate rank's rounds complete
// throughout, and the relay's resident memory stays under the bound
// docs/relay.md derives from its flags ("What the ranks can make a relay
// hold").
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/http2_flood.h"
#include "tests/testing/round_cluster.h"
#include "tests/testing/scrape.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

using testing::AggregatorProcess;
using testing::ReadFile;
using testing::Subprocess;
using Stub = v1::Aggregator::Stub;
using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;

// The relay's bounds.
constexpr int64_t kMaxMessageBytes = 256 << 10;
constexpr int kMaxStreams = 8;
constexpr int kMaxWaitingCalls = 4;
// What gRPC's transport may hold: above what the floods make it hold (the
// non-readers' unread HTTP/2 windows), so that its reclaimer cuts none of
// their streams (as tests/flood_test.cc sizes the aggregator's).
constexpr int64_t kMaxTransportBytes = 64 << 20;
// relay/relay_options.h: a stream reads no more past this many messages.
constexpr int64_t kHeldMessagesPerStream = 4;

// The bound of docs/relay.md, above the relay's warmed-up footprint, in
// kB: what gRPC's transport may hold; each stream's contributions and
// answers (up to kHeldMessagesPerStream messages, and the one read last),
// twice for the copies alongside them (a merge, a serialized answer); each
// ReduceOnce's request as gRPC parsed it, the relay's copy, its answer and
// the answer serialized; slack for the allocator, threads and gRPC's
// bookkeeping.
int64_t BoundKb() {
  const int64_t streams =
      kMaxStreams * (kHeldMessagesPerStream + 1) * kMaxMessageBytes * 2;
  const int64_t calls = kMaxWaitingCalls * 4 * kMaxMessageBytes;
  const int64_t slack = 48 << 20;
  return (kMaxTransportBytes + streams + calls + slack) / 1024;
}

// What a flood's freed heap may leave resident before the next: the
// relay's trim (server/memory_trimmer.h) gives the rest back within about
// a period of 5 s.
constexpr int64_t kEndSlackKb = 16 << 10;
constexpr absl::Duration kTrimWait = absl::Seconds(8);

// A sanitizer's shadow memory and deferred frees are no part of the
// bound: built with one, the floods run and every refusal is checked, but
// not the resident memory.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kMemoryChecked = false;
#else
constexpr bool kMemoryChecked = true;
#endif

std::vector<std::string> RelayFlags(const std::string& upstream) {
  return {"--upstream=" + upstream,
          absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
          absl::StrCat("--max_streams=", kMaxStreams),
          absl::StrCat("--max_waiting_calls=", kMaxWaitingCalls),
          absl::StrCat("--max_transport_bytes=", kMaxTransportBytes),
          "--metrics_listen=127.0.0.1:0"};
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

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

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  static std::atomic<int> next{0};
  grpc::ChannelArguments args;
  args.SetInt("syncnorm.relay_flood_test.connection", ++next);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

v1::Contribution Forward(const std::string& job, int rank, int64_t step,
                         int channels) {
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

// Samples a process's resident memory until stopped; keeps the peak.
class RssSampler {
 public:
  explicit RssSampler(pid_t pid) : pid_(pid), thread_([this] { Loop(); }) {}
  ~RssSampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int64_t peak_kb() const { return peak_kb_.load(); }

 private:
  void Loop() {
    while (!stop_.load()) {
      auto s = testing::ReadProcStats(pid_);
      if (s.ok() && s->rss_kb > peak_kb_.load()) peak_kb_.store(s->rss_kb);
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  const pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> peak_kb_{0};
  std::thread thread_;
};

// A Reduce stream whose client writes from a thread of its own and never
// reads; ends when cancelled.
class NonReader {
 public:
  NonReader(const std::string& address, const std::string& job, int channels)
      : stub_(v1::Aggregator::NewStub(NewChannel(address))),
        stream_(stub_->Reduce(&context_)),
        thread_([this, job, channels] {
          for (int64_t step = 0; step < 100000; ++step) {
            if (!stream_->Write(Forward(job, 0, step, channels))) break;
          }
        }) {}
  ~NonReader() {
    context_.TryCancel();
    thread_.join();
    stream_->Finish().IgnoreError();
  }

 private:
  std::unique_ptr<Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  std::thread thread_;
};

// One rank's stream; Round sends and waits for the answer.
class RankStream {
 public:
  explicit RankStream(const std::string& address)
      : stub_(v1::Aggregator::NewStub(NewChannel(address))),
        stream_(stub_->Reduce(&context_)) {}
  ~RankStream() {
    context_.TryCancel();
    Finish().IgnoreError();
  }
  absl::Status Round(const v1::Contribution& c) {
    if (!stream_->Write(c)) return Finish();
    v1::RoundResult r;
    if (!stream_->Read(&r)) return Finish();
    if (!r.has_error()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(r.error().code()),
                        r.error().message());
  }
  absl::Status Finish() {
    if (!finished_) {
      finished_ = true;
      status_ = FromGrpc(stream_->Finish());
    }
    return status_;
  }

 private:
  std::unique_ptr<Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  bool finished_ = false;
  absl::Status status_;
};

class RelayFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeScratchDir("relay_flood");
    auto aggregator = AggregatorProcess::Start(dir_, {});
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    shard_ = v1::Aggregator::NewStub(NewChannel(aggregator_->address()));
    const std::string port_file = dir_ + "/relay.port";
    std::vector<std::string> argv = {testing::Runfile("relay/syncnorm_relay"),
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file};
    for (std::string& f : RelayFlags(aggregator_->address())) {
      argv.push_back(std::move(f));
    }
    auto relay = Subprocess::Spawn(argv, dir_ + "/relay.log");
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = *std::move(relay);
    int port = 0;
    for (const absl::Time until = absl::Now() + absl::Seconds(10);
         port == 0 && absl::Now() < until;
         absl::SleepFor(absl::Milliseconds(10))) {
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)),
                            &port)) {
        port = 0;
      }
    }
    ASSERT_GT(port, 0) << ReadFile(dir_ + "/relay.log");
    port_ = port;
    address_ = absl::StrCat("127.0.0.1:", port);
    // "metrics_port=N" of the relay's start line.
    const std::string log = ReadFile(dir_ + "/relay.log");
    const size_t at =
        log.find("metrics_port=", log.find("event=relay_started"));
    if (at != std::string::npos)
      metrics_port_ = std::atoi(log.c_str() + at + 13);
    ASSERT_GT(metrics_port_, 0) << ReadFile(dir_ + "/relay.log");
  }

  void CreateJob(const std::string& job, int world, int channels) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.set_round_timeout_ms(30000);
    request.add_layers()->set_num_features(channels);
    grpc::ClientContext context;
    v1::JobInfo info;
    const grpc::Status s = shard_->CreateJob(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  absl::Status ReduceOnce(const v1::Contribution& c) {
    auto stub = v1::Aggregator::NewStub(NewChannel(address_));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::RoundResult r;
    return FromGrpc(stub->ReduceOnce(&context, c, &r));
  }

  double Metric(const std::string& series) {
    return testing::Sample(testing::ScrapeMetrics(metrics_port_), series)
        .value_or(-1);
  }

  // Connections the relay closed for floods (its guard, its loop's watchdog).
  double GuardCloses() {
    const std::string text = testing::ScrapeMetrics(metrics_port_);
    double n = 0;
    for (const char* reason : {"rapid_reset", "overload", "read_flood"}) {
      n += testing::Sample(text,
                           absl::StrCat("syncnorm_relay_connections_closed_"
                                        "total{reason=\"",
                                        reason, "\"}"))
               .value_or(0);
    }
    return n;
  }

  int64_t RssKb() {
    auto s = testing::ReadProcStats(relay_->pid());
    return s.ok() ? s->rss_kb : 0;
  }

  // The relay's resident memory once it is at most `kb`, or at `timeout`.
  int64_t RssKbOnceAtMost(int64_t kb, absl::Duration timeout) {
    return testing::RssKbOnceAtMost(relay_->pid(), kb, timeout);
  }

  // Two ranks' round of the legitimate job on their own streams.
  void LegitRound(RankStream& a, RankStream& b, int64_t step) {
    absl::Status sa;
    std::thread t([&] { sa = a.Round(Forward("legit", 0, step, 64)); });
    const absl::Status sb = b.Round(Forward("legit", 1, step, 64));
    t.join();
    EXPECT_TRUE(sa.ok()) << "step " << step << ": " << sa;
    EXPECT_TRUE(sb.ok()) << "step " << step << ": " << sb;
  }

  std::string dir_;
  std::unique_ptr<AggregatorProcess> aggregator_;
  std::unique_ptr<Stub> shard_;
  std::unique_ptr<Subprocess> relay_;
  int port_ = 0;
  std::string address_;
  int metrics_port_ = 0;
};

TEST_F(RelayFloodTest, MemoryStaysBoundedAndEveryBoundIsNamed) {
  constexpr int kFloodChannels = 8000;  // 128 kB a message
  constexpr int kWaitChannels = 15000;  // 240 kB: near the bound
  CreateJob("legit", 2, 64);
  CreateJob("flood", 1, kFloodChannels);
  CreateJob("wait", 2, kWaitChannels);
  // The legitimate ranks' streams, opened first; warm up.
  RankStream rank0(address_);
  RankStream rank1(address_);
  int64_t step = 0;
  for (; step < 5; ++step) LegitRound(rank0, rank1, step);
  ASSERT_TRUE(ReduceOnce(Forward("flood", 0, 0, kFloodChannels)).ok());
  const int64_t rss_start = RssKb();
  RssSampler sampler(relay_->pid());

  // Messages over the bound: refused naming it, or cut off by gRPC past
  // its ceiling (twice the bound).
  EXPECT_EQ(NamesLimit(ReduceOnce(Forward("wait", 0, 0, 20000)),
                       "max_message_bytes", kMaxMessageBytes),
            "");
  EXPECT_EQ(ReduceOnce(Forward("wait", 0, 0, 40000)).code(),
            absl::StatusCode::kResourceExhausted);

  // Every other stream slot taken by a client that writes and never reads.
  std::vector<std::unique_ptr<NonReader>> non_readers;
  for (int i = 0; i < kMaxStreams - 2; ++i) {
    non_readers.push_back(
        std::make_unique<NonReader>(address_, "flood", kFloodChannels));
  }
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       Metric("syncnorm_relay_open_streams") < kMaxStreams &&
       absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(20))) {
  }
  ASSERT_EQ(Metric("syncnorm_relay_open_streams"), kMaxStreams)
      << testing::ScrapeMetrics(metrics_port_) << ReadFile(dir_ + "/relay.log");
  // More streams: refused naming the bound.
  for (int i = 0; i < 10; ++i) {
    RankStream extra(address_);
    EXPECT_EQ(NamesLimit(extra.Round(Forward("legit", 0, 999, 64)),
                         "max_streams", kMaxStreams),
              "");
  }
  // ReduceOnce calls parked in their blocks (rank 1 never comes) up to the
  // bound, near-max messages; one more is refused.
  struct Call {
    grpc::ClientContext context;
    v1::Contribution request;
    v1::RoundResult result;
    grpc::Status status;
    absl::Notification done;
  };
  auto call_stub = v1::Aggregator::NewStub(NewChannel(address_));
  std::vector<std::unique_ptr<Call>> calls;
  for (int64_t s = 0; s < kMaxWaitingCalls; ++s) {
    calls.push_back(std::make_unique<Call>());
    Call* c = calls.back().get();
    c->request = Forward("wait", 0, s, kWaitChannels);
    call_stub->async()->ReduceOnce(&c->context, &c->request, &c->result,
                                   [c](grpc::Status st) {
                                     c->status = std::move(st);
                                     c->done.Notify();
                                   });
  }
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       Metric("syncnorm_relay_waiting_calls") < kMaxWaitingCalls &&
       absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(20))) {
  }
  EXPECT_EQ(NamesLimit(ReduceOnce(Forward("wait", 0, 9, kWaitChannels)),
                       "max_waiting_calls", kMaxWaitingCalls),
            "");

  // The legitimate ranks' rounds go on through it all.
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) LegitRound(rank0, rank1, step++);
  const double held = Metric("syncnorm_relay_held_bytes");
  sampler.Stop();
  const int64_t grew = sampler.peak_kb() - rss_start;
  std::fprintf(stderr,
               "relay rss %lld kB at start, peak %lld kB (+%lld kB, bound "
               "%lld kB); streams hold %.0f bytes\n",
               static_cast<long long>(rss_start),
               static_cast<long long>(sampler.peak_kb()),
               static_cast<long long>(grew), static_cast<long long>(BoundKb()),
               held);
  if (kMemoryChecked) {
    EXPECT_LE(grew, BoundKb());
  }
  // The non-readers hold their streams' bound, no more.
  EXPECT_GT(held,
            (kMaxStreams - 2) * kHeldMessagesPerStream * kMaxMessageBytes / 2);
  EXPECT_LE(held,
            kMaxStreams * (kHeldMessagesPerStream + 2) * kMaxMessageBytes);
  EXPECT_GE(
      Metric("syncnorm_relay_refusals_total{code=\"RESOURCE_EXHAUSTED\"}"), 12);

  // The abusers go; rank 1 answers the parked calls, on a freed slot.
  non_readers.clear();
  {
    RankStream late(address_);
    for (int64_t s = 0; s < kMaxWaitingCalls; ++s) {
      const absl::Status round =
          late.Round(Forward("wait", 1, s, kWaitChannels));
      EXPECT_TRUE(round.ok()) << "step " << s << ": " << round;
    }
  }
  for (auto& c : calls) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
  }
  for (int i = 0; i < 5; ++i) LegitRound(rank0, rank1, step++);
  relay_->Signal(SIGTERM);
  absl::StatusOr<int> code = relay_->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadFile(dir_ + "/relay.log");
}

TEST_F(RelayFloodTest, RapidResetsLeaveTheRanksServedAndMemoryBounded) {
  CreateJob("legit", 2, 64);
  RankStream rank0(address_);
  RankStream rank1(address_);
  int64_t step = 0;
  for (; step < 5; ++step) LegitRound(rank0, rank1, step);
  const int64_t rss_start = RssKb();
  RssSampler sampler(relay_->pid());
  v1::Contribution c = Forward("legit", 0, 1 << 20, 64);
  int floods = 0;
  for (const char* path :
       {"/syncnorm.v1.Aggregator/ReduceOnce", "/syncnorm.v1.Aggregator/Reduce",
        "/syncnorm.v1.Aggregator/GetJob"}) {
    // Each flood starts near the footprint: what the last one freed goes
    // back at the relay's next trim (every 5 s), as the aggregator's
    // (tests/flood_test.cc). A flood that starts on freed heap still
    // resident grows the relay's memory only once it has used that up,
    // so the read-flood watchdog would see it late.
    const int64_t before = RssKbOnceAtMost(rss_start + kEndSlackKb, kTrimWait);
    testing::Http2FloodOptions o;
    o.port = port_;
    o.path = path;
    o.message = c.SerializeAsString();
    o.requests = 20000;
    o.reset = true;
    o.timeout = absl::Seconds(30);
    o.hold_open = absl::Seconds(1);
    std::atomic<bool> flooding{true};
    std::thread ranks([&] {
      while (flooding.load()) LegitRound(rank0, rank1, step++);
    });
    auto result = testing::FloodHttp2(o);
    flooding.store(false);
    ranks.join();
    ASSERT_TRUE(result.ok()) << result.status();
    std::fprintf(stderr,
                 "rapid reset of %s: %d sent in %.2f s, %d answered, closed "
                 "%d; relay rss +%lld kB before it\n",
                 path, result->sent, absl::ToDoubleSeconds(result->took),
                 result->responses, result->closed,
                 static_cast<long long>(before - rss_start));
    // The aggregator's defences closed it: its connection guard, as a
    // rapid reset or for the calls it started while the relay held too
    // many, or the RPC loop's watchdog, for a pass through gRPC that kept
    // the loop's thread reading it while the memory grew (read_flood.h).
    EXPECT_TRUE(result->closed) << path;
    ++floods;
    for (const absl::Time until = absl::Now() + absl::Seconds(10);
         GuardCloses() < floods && absl::Now() < until;
         absl::SleepFor(absl::Milliseconds(20))) {
    }
    EXPECT_EQ(GuardCloses(), floods)
        << path << ": " << ReadFile(dir_ + "/relay.log");
  }
  sampler.Stop();
  const int64_t grew = sampler.peak_kb() - rss_start;
  std::fprintf(stderr, "relay rss +%lld kB at the floods' peak (bound %lld)\n",
               static_cast<long long>(grew), static_cast<long long>(BoundKb()));
  if (kMemoryChecked) {
    EXPECT_LE(grew, BoundKb());
  }
  for (int i = 0; i < 5; ++i) LegitRound(rank0, rank1, step++);
}

}  // namespace
}  // namespace syncnorm
