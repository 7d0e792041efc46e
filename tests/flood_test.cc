// Memory under abuse: the real aggregator binary with small limits is
// flooded within them and beyond them (jobs, open streams, rounds in
// flight, near-max messages, oversized messages, clients that send without
// reading, duplicate retries, streams abandoned by cancelled calls and by
// killed processes, unary calls parked waiting for their rounds and
// steps). Every over-limit attempt must get RESOURCE_EXHAUSTED naming its
// flag; the server's resident memory must stay under a bound
// derived from the limits (at its peak and after), come back near where it
// started once the abusers are gone, and the server must then still serve
// correct rounds. A message far above every limit is cut off by gRPC's
// transport quota before much of it arrives, and the server serves on.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/health.h"
#include "tests/testing/round_cluster.h"
#include "tests/testing/round_payload.h"
#include "tests/testing/scrape.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

using Stub = v1::Aggregator::Stub;
using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;

// The server's limits.
constexpr int64_t kMaxMessageBytes = 128 << 10;
constexpr int kMaxJobs = 6;
constexpr int kMaxLayersPerJob = 4;
constexpr int kMaxChannels = 8000;  // x 16 bytes: a near-max message
constexpr int kMaxWorldSize = 3;
constexpr int64_t kMaxChannelsPerJob = 2 * kMaxChannels;
constexpr int kMaxPendingRounds = 48;
constexpr int kMaxStreams = 12;
// Above the unary calls the floods run at once (kTestCalls).
constexpr int kMaxWaitingCalls = 8;
// What gRPC's transport may hold: well above what the floods below make it
// hold (two clients' unread HTTP/2 windows, near-max messages being
// received), so that its reclaimer cuts none of their streams.
constexpr int64_t kMaxTransportBytes = 64 << 20;

// Server constants the bound depends on (server/reduce_reactor.h,
// server/server.cc, server/round.h, server/rocksdb_engine.h).
constexpr int64_t kHeldMessages = 16;        // per stream, x max message
constexpr int64_t kStreamWindow = 8 << 20;   // HTTP/2 stream lookahead
constexpr int64_t kRetryWindow = 8;          // finished rounds per layer
constexpr int64_t kRocksDbBytes = 48 << 20;  // 2 memtables + block cache
constexpr int64_t kTestCalls = 4;  // unary calls this test runs at once
// How far above its warmed-up footprint the server may stay once the
// abusers are gone: the state store's memtables, which the floods' rounds
// fill (2 x 8 MiB; the warm-up wrote less), and what glibc keeps between
// two of the server's trims of the heap (server/memory_trimmer.h; 5 s).
constexpr int64_t kEndSlackKb = 16 << 10;
constexpr absl::Duration kTrimWait = absl::Seconds(8);

// The most the server may hold above its warmed-up footprint, in kB.
//   streams: each holds what its client sent and the server did not read
//     yet (the HTTP/2 window; all streams' together are also capped by
//     --max_transport_bytes), up to kHeldMessages x max_message_bytes of
//     unanswered contributions and unwritten results, and the message being
//     received (up to twice the limit: gRPC's receive ceiling) and parsed;
//   unary calls: a message being received and parsed each;
//   rounds: every pending round holds up to max_world_size contributions
//     of at most max_message_bytes;
//   jobs: per channel and group, the running mean and var (16 B) and the
//     retry window: kRetryWindow forward outcomes (mean, var) and the stats
//     after them (32 B each), and as many backward outcomes (16 B each);
//   the state store's memtables and block cache;
//   slack for the allocator, thread stacks and gRPC's own bookkeeping.
int64_t BoundKb() {
  const int64_t per_stream =
      kStreamWindow + kHeldMessages * kMaxMessageBytes + 3 * kMaxMessageBytes;
  const int64_t streams = kMaxStreams * per_stream;
  const int64_t calls = kTestCalls * 3 * kMaxMessageBytes;
  const int64_t rounds =
      int64_t{kMaxPendingRounds} * kMaxWorldSize * kMaxMessageBytes;
  const int64_t jobs =
      kMaxJobs * kMaxChannelsPerJob * (16 + kRetryWindow * (32 + 16));
  const int64_t slack = 32 << 20;
  return (streams + calls + rounds + jobs + kRocksDbBytes + slack) / 1024;
}

// A message far above both --max_message_bytes and the quota.
constexpr int64_t kHugeMessageBytes = int64_t{256} << 20;

// The most the server may hold above its footprint while it is sent the
// huge message, in kB: what the transport holds, up to
// --max_transport_bytes; what it reads past that before the stream is
// cancelled (gRPC's quota is soft: reads go on while its reclaimer runs,
// and it cancels other streams first; up to 44 MiB measured on a loaded
// 2-core machine); slack for the allocator, thread stacks and gRPC's
// bookkeeping. Without the quota the transport takes all of the message
// before its size check, 256 MiB: over this bound.
int64_t HugeMessageBoundKb() {
  const int64_t overshoot = 64 << 20;
  const int64_t slack = 16 << 20;
  return (kMaxTransportBytes + overshoot + slack) / 1024;
}

// Shorter than the default (1 s), so that the test sees it honoured.
constexpr absl::Duration kStragglerThreshold = absl::Milliseconds(100);

// Every straggler has a line of its own (--log_interval_ms=0): each flood
// checks that its own is reported, within the default interval of the
// previous one.
std::vector<std::string> ServerFlags() {
  return {absl::StrCat("--straggler_threshold_ms=",
                       absl::ToInt64Milliseconds(kStragglerThreshold)),
          "--log_interval_ms=0",
          absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
          absl::StrCat("--max_jobs=", kMaxJobs),
          absl::StrCat("--max_layers_per_job=", kMaxLayersPerJob),
          absl::StrCat("--max_channels=", kMaxChannels),
          absl::StrCat("--max_world_size=", kMaxWorldSize),
          absl::StrCat("--max_channels_per_job=", kMaxChannelsPerJob),
          absl::StrCat("--max_pending_rounds=", kMaxPendingRounds),
          absl::StrCat("--max_streams=", kMaxStreams),
          absl::StrCat("--max_waiting_calls=", kMaxWaitingCalls),
          absl::StrCat("--max_transport_bytes=", kMaxTransportBytes),
          // As deployed; the quota's cuts must show in its gRPC metrics.
          "--metrics_listen=127.0.0.1:0"};
}

v1::CreateJobRequest Job(const std::string& id, int world, int layers,
                         int channels, int64_t round_timeout_ms) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(world);
  r.set_round_timeout_ms(round_timeout_ms);
  for (int l = 0; l < layers; ++l) {
    v1::LayerSpec* layer = r.add_layers();
    layer->set_name(absl::StrCat("bn", l));
    layer->set_num_features(channels);
    layer->set_biased_running_var(true);
  }
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
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

// RESOURCE_EXHAUSTED naming --flag=<value>: "" or what is wrong.
std::string NamesLimit(const absl::Status& s, const std::string& flag,
                       int64_t value) {
  const std::string want = absl::StrCat("--", flag, "=", value);
  if (s.code() == absl::StatusCode::kResourceExhausted &&
      absl::StrContains(s.message(), want)) {
    return "";
  }
  return absl::StrCat("expected RESOURCE_EXHAUSTED naming ", want, ", got ",
                      s.ToString());
}

// A channel of its own (its own connection): other flows' HTTP/2 windows
// do not slow it down.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, int tag) {
  grpc::ChannelArguments args;
  args.SetInt("syncnorm.flood_test.connection", tag);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

// A ReduceOnce request of `bytes` (a multiple of 1 MiB), sent on a
// connection of its own by a client that lets gRPC send any size; its
// status. The request is unparsed bytes: one block of zeros referenced over
// and over, so that the client holds 1 MiB whatever the size. The server
// never parses it: gRPC cuts it off first.
grpc::Status SendRawRequest(const std::string& address, int64_t bytes) {
  const std::string block(1 << 20, '\0');
  const grpc::Slice slice(block.data(), block.size(),
                          grpc::Slice::STATIC_SLICE);
  const std::vector<grpc::Slice> slices(bytes / block.size(), slice);
  const grpc::ByteBuffer request(slices.data(), slices.size());
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt("syncnorm.flood_test.connection", -1);
  grpc::GenericStub stub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(
      &context,
      absl::StrCat("/", v1::Aggregator::service_full_name(), "/ReduceOnce"),
      request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Samples the server's resident memory until stopped; keeps the peak.
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
      auto s = ReadProcStats(pid_);
      if (s.ok() && s->rss_kb > peak_kb_.load()) peak_kb_.store(s->rss_kb);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  const pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> peak_kb_{0};
  std::thread thread_;
};

// A Reduce stream whose client writes from a thread of its own and never
// reads (results back up on the server); ends when cancelled.
class NonReader {
 public:
  NonReader(std::shared_ptr<grpc::Channel> channel,
            std::vector<v1::Contribution> messages)
      : channel_(std::move(channel)),
        stub_(v1::Aggregator::NewStub(channel_)),
        stream_(stub_->Reduce(&context_)),
        thread_([this, messages = std::move(messages)] {
          for (const v1::Contribution& c : messages) {
            if (!stream_->Write(c)) break;
            written_.fetch_add(1);
          }
        }) {}
  ~NonReader() { Cancel(); }
  // The client goes away mid-stream, reading nothing.
  void Cancel() {
    if (!thread_.joinable()) return;
    context_.TryCancel();
    thread_.join();
    (void)stream_->Finish();
  }
  int written() const { return written_.load(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  std::atomic<int> written_{0};
  std::thread thread_;
};

// Starts round workers that send step 1 of every layer of `job` as ranks
// 0 and 1 and then hold them (the caller kills them).
std::vector<std::unique_ptr<Subprocess>> HoldRounds(const std::string& address,
                                                    const std::string& dir,
                                                    const std::string& job,
                                                    int layers, int channels) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = absl::StrCat(dir, "/hold", rank, ".log");
    auto w = Subprocess::Spawn(
        {Runfile("tests/round-worker"), absl::StrCat("--server=", address),
         absl::StrCat("--jobs=", job), absl::StrCat("--rank=", rank),
         absl::StrCat("--world_size=", kMaxWorldSize),
         absl::StrCat("--layers=", layers),
         absl::StrCat("--channels=", channels), "--hold_step=1",
         absl::StrCat("--log=", dir, "/hold", rank, ".rounds")},
        log);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) workers.push_back(*std::move(w));
  }
  return workers;
}

class FloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir("flood");
    auto server = LocalAggregator::Start(dir_, ServerFlags());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = NewChannel(server_->address(), 0);
    stub_ = v1::Aggregator::NewStub(channel_);
    ASSERT_TRUE(CreateJob(Job("normal", 2, 1, 512, 2000)).ok());
  }

  int64_t RssKb() {
    auto s = ReadProcStats(server_->process().pid());
    return s.ok() ? s->rss_kb : -1;
  }

  // The resident memory once it is at most `kb`, or after `timeout`.
  int64_t RssKbOnceAtMost(int64_t kb, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int64_t rss = RssKb();
    while (rss > kb && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      rss = RssKb();
    }
    return rss;
  }

  absl::StatusOr<v1::CheckpointInfo> Checkpoint(const std::string& job,
                                                int64_t step,
                                                const std::string& tag,
                                                absl::Duration timeout) {
    v1::CheckpointRequest r;
    r.set_job_id(job);
    r.set_step(step);
    r.set_tag(tag);
    v1::CheckpointInfo info;
    grpc::Status s = stub_->Checkpoint(Context(timeout).get(), r, &info);
    if (!s.ok()) return FromGrpc(s);
    return info;
  }

  absl::Status CreateJob(const v1::CreateJobRequest& r) {
    v1::JobInfo info;
    return FromGrpc(
        stub_->CreateJob(Context(absl::Seconds(10)).get(), r, &info));
  }
  absl::Status DeleteJob(const std::string& id) {
    v1::DeleteJobRequest r;
    r.set_job_id(id);
    v1::DeleteJobResponse out;
    return FromGrpc(
        stub_->DeleteJob(Context(absl::Seconds(10)).get(), r, &out));
  }
  absl::StatusOr<v1::RoundResult> ReduceOnce(const v1::Contribution& c,
                                             absl::Duration timeout) {
    v1::RoundResult r;
    grpc::Status s = stub_->ReduceOnce(Context(timeout).get(), c, &r);
    if (!s.ok()) return FromGrpc(s);
    return r;
  }

  // A world-1 round of `channels` on (job, layer, step), checked against
  // the reference merge; "" or what is wrong.
  std::string SoloRound(const std::string& job, int layer, int64_t step,
                        int channels) {
    auto r = ReduceOnce(RoundContribution(job, layer, step, 0, channels),
                        absl::Seconds(20));
    if (!r.ok()) return r.status().ToString();
    return CheckGlobal(r->moments(),
                       ReferenceMerge(job, layer, step, {0}, channels));
  }

  // Rank 1 later than --straggler_threshold_ms: the round's log line
  // names it.
  void ExpectStragglerReported(Stream& stream, int64_t step) {
    auto [answer, rank0] =
        NormalRound(stream, step, RoundContribution("normal", 0, step, 1, 512),
                    kStragglerThreshold * 3);
    EXPECT_TRUE(answer.ok() && rank0.ok()) << answer << rank0.status();
    const std::string log = ReadFile(dir_ + "/aggregator.log");
    EXPECT_TRUE(absl::StrContains(
        log, absl::StrCat("event=straggler job=normal group=0 layer=0 step=",
                          step, " ")))
        << log;
  }

  // Near-max rounds on a job that warms up what the flood uses (gRPC's
  // buffers, the store, the allocator's arenas); then deleted.
  void WarmUp() {
    ASSERT_TRUE(CreateJob(Job("warm", 1, 2, kMaxChannels, 5000)).ok());
    std::vector<std::thread> threads;
    for (int layer = 0; layer < 2; ++layer) {
      threads.emplace_back([this, layer] {
        for (int step = 0; step < 24; ++step) {
          EXPECT_EQ(SoloRound("warm", layer, step, kMaxChannels), "");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(DeleteJob("warm").ok());
    absl::SleepFor(absl::Milliseconds(500));
  }

  // Jobs up to --max_jobs ("normal" is there already), and beyond it and
  // --max_channels_per_job. big: near-max rounds; flow: clients that do
  // not read; pend: rounds in flight and duplicate retries; hold: rounds
  // of killed clients; filler: the last slot.
  void CreateJobsPastTheLimits() {
    ASSERT_TRUE(CreateJob(Job("big", 1, 2, kMaxChannels, 5000)).ok());
    ASSERT_TRUE(CreateJob(Job("flow", 1, 2, kMaxChannels, 5000)).ok());
    ASSERT_TRUE(CreateJob(Job("pend", 2, 1, 1000, 5000)).ok());
    ASSERT_TRUE(CreateJob(Job("hold", kMaxWorldSize, 2, 64, 5000)).ok());
    // 3 groups x 2 layers x 8000 channels: 48000 channels to keep.
    v1::CreateJobRequest wide = Job("wide", kMaxWorldSize, 2, kMaxChannels, 0);
    wide.set_group_size(1);
    EXPECT_EQ(
        NamesLimit(CreateJob(wide), "max_channels_per_job", kMaxChannelsPerJob),
        "");
    ASSERT_TRUE(CreateJob(Job("filler", 1, 1, 8, 0)).ok());
    EXPECT_EQ(NamesLimit(CreateJob(Job("one-too-many", 1, 1, 8, 0)), "max_jobs",
                         kMaxJobs),
              "");
  }

  // Clients that vanish with rounds open: processes killed -9 (their
  // connections reset), and a call cancelled mid-stream.
  void AbandonRounds() {
    std::vector<std::unique_ptr<Subprocess>> holders =
        HoldRounds(server_->address(), dir_, "hold", 2, 64);
    absl::SleepFor(absl::Seconds(1));  // their contributions are in
    for (auto& w : holders) w->Signal(SIGKILL);
    for (auto& w : holders) (void)w->Wait(absl::Seconds(10));
    auto stub = v1::Aggregator::NewStub(NewChannel(server_->address(), 1));
    grpc::ClientContext context;
    auto stream = stub->Reduce(&context);
    ASSERT_TRUE(stream->Write(RoundContribution("pend", 0, 1000, 0, 1000)));
    absl::SleepFor(absl::Milliseconds(100));
    context.TryCancel();
    (void)stream->Finish();
  }

  // Clients that never read: one resends a waiting contribution (of the
  // abandoned stream's round, whose waiter it evicts), two send near-max
  // contributions to rounds that complete at once, so results back up.
  void StartNonReaders() {
    dup_ = std::make_unique<NonReader>(
        NewChannel(server_->address(), 2),
        std::vector<v1::Contribution>(
            400, RoundContribution("pend", 0, 1000, 0, 1000)));
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<v1::Contribution> flow;
      for (int step = 0; step < 200; ++step) {
        flow.push_back(RoundContribution("flow", layer, step, 0, kMaxChannels));
      }
      non_readers_.push_back(std::make_unique<NonReader>(
          NewChannel(server_->address(), 3 + layer), std::move(flow)));
    }
  }

  // Near-max rounds that are read, on two threads, and one unary message
  // over the limit.
  void NearMaxRounds() {
    std::vector<std::thread> threads;
    for (int layer = 0; layer < 2; ++layer) {
      threads.emplace_back([this, layer] {
        for (int step = 0; step < 30; ++step) {
          EXPECT_EQ(SoloRound("big", layer, step, kMaxChannels), "");
        }
      });
    }
    // 8200 channels: 131 kB, over 128 KiB.
    auto over = ReduceOnce(RoundContribution("big", 0, 1000, 0, 8200),
                           absl::Seconds(10));
    EXPECT_EQ(NamesLimit(over.status(), "max_message_bytes", kMaxMessageBytes),
              "");
    for (std::thread& t : threads) t.join();
  }

  // One rank of "pend" sends steps 1..kPendWrites; the other never comes.
  // Those beyond --max_pending_rounds are refused in-band; the others fail
  // at their deadline. A thread reads the answers.
  static constexpr int kPendWrites = kMaxPendingRounds + 12;
  void FillRounds() {
    pend_context_ = std::make_unique<grpc::ClientContext>();
    pend_ = stub_->Reduce(pend_context_.get());
    pend_answers_.clear();
    pend_reader_ = std::thread([this] {
      v1::RoundResult r;
      while (pend_->Read(&r)) {
        absl::MutexLock lock(&pend_mu_);
        pend_answers_.push_back(InBand(r));
      }
    });
    for (int step = 1; step <= kPendWrites; ++step) {
      ASSERT_TRUE(pend_->Write(RoundContribution("pend", 0, step, 0, 1000)));
    }
  }

  // Opens streams until one is refused (naming --max_streams); on the last
  // one open, a message over the limit is refused in-band, echoing its
  // round, and the stream serves on.
  void ProbeStreams() {
    absl::Status refused;
    for (int i = 0; i <= kMaxStreams && refused.ok(); ++i) {
      probe_contexts_.push_back(std::make_unique<grpc::ClientContext>());
      probes_.push_back(stub_->Reduce(probe_contexts_.back().get()));
      v1::RoundResult r;
      if (!probes_.back()->Write(RoundContribution("nope", 0, 0, 0, 1)) ||
          !probes_.back()->Read(&r)) {
        refused = FromGrpc(probes_.back()->Finish());
        probes_.pop_back();
        probe_contexts_.pop_back();
      } else {
        EXPECT_EQ(InBand(r).code(), absl::StatusCode::kNotFound) << InBand(r);
      }
    }
    EXPECT_EQ(NamesLimit(refused, "max_streams", kMaxStreams), "");
    ASSERT_FALSE(probes_.empty());
    Stream& open = *probes_.back();
    v1::RoundResult r;
    ASSERT_TRUE(open.Write(RoundContribution("big", 1, 1000, 0, 8200)));
    ASSERT_TRUE(open.Read(&r));
    EXPECT_EQ(NamesLimit(InBand(r), "max_message_bytes", kMaxMessageBytes), "");
    EXPECT_EQ(r.job_id(), "big");
    EXPECT_EQ(r.step(), 1000);
    ASSERT_TRUE(open.Write(RoundContribution("nope", 0, 0, 0, 1)));
    ASSERT_TRUE(open.Read(&r));
    EXPECT_EQ(InBand(r).code(), absl::StatusCode::kNotFound) << InBand(r);
  }

  // The abusers go away; every contribution of "pend" was answered.
  void Release() {
    for (auto& n : non_readers_) n->Cancel();
    non_readers_.clear();
    dup_.reset();
    for (auto& ctx : probe_contexts_) ctx->TryCancel();
    for (auto& p : probes_) (void)p->Finish();
    probes_.clear();
    probe_contexts_.clear();
    pend_->WritesDone();
    pend_reader_.join();  // once the rounds in flight expired
    EXPECT_TRUE(pend_->Finish().ok());
    pend_.reset();
    pend_context_.reset();
    absl::MutexLock lock(&pend_mu_);
    EXPECT_EQ(pend_answers_.size(), size_t{kPendWrites});
    int refused = 0;
    for (const absl::Status& s : pend_answers_) {
      if (s.code() == absl::StatusCode::kDeadlineExceeded) continue;
      EXPECT_EQ(NamesLimit(s, "max_pending_rounds", kMaxPendingRounds), "");
      ++refused;
    }
    EXPECT_GE(refused, kPendWrites - kMaxPendingRounds);
  }

  // The whole flood; its resident memory once every abuser is at it.
  int64_t Flood() {
    CreateJobsPastTheLimits();
    AbandonRounds();
    StartNonReaders();
    NearMaxRounds();
    FillRounds();
    ProbeStreams();
    absl::SleepFor(absl::Seconds(1));  // the non-readers are blocked by now
    const int64_t rss = RssKb();
    std::fprintf(stderr,
                 "flood: the non-readers wrote %d and %d near-max messages, "
                 "the duplicate sender %d; %zu probe streams fit\n",
                 non_readers_[0]->written(), non_readers_[1]->written(),
                 dup_->written(), probes_.size());
    Release();
    for (const char* id : {"big", "flow", "pend", "hold", "filler"}) {
      EXPECT_TRUE(DeleteJob(id).ok()) << id;
    }
    return rss;
  }

  // A 2-rank round of "normal" at `step` whose rank 0 comes through
  // ReduceOnce and rank 1 through `stream`, with `rank1` as its
  // contribution: rank 1's answer and rank 0's outcome.
  std::pair<absl::Status, absl::StatusOr<v1::RoundResult>> NormalRound(
      Stream& stream, int64_t step, const v1::Contribution& rank1,
      absl::Duration rank1_late = absl::ZeroDuration()) {
    absl::StatusOr<v1::RoundResult> rank0;
    std::thread t([&] {
      rank0 = ReduceOnce(RoundContribution("normal", 0, step, 0, 512),
                         absl::Seconds(20));
    });
    absl::SleepFor(rank1_late);
    v1::RoundResult r;
    absl::Status answer = absl::DataLossError("the stream broke");
    if (stream.Write(rank1) && stream.Read(&r)) answer = InBand(r);
    t.join();
    return {answer, rank0};
  }

  // A rank whose contribution is over --max_message_bytes is refused
  // in-band, alone: its round waits for it and fails at its deadline for
  // the others, naming it. Then rounds are served, equal to the reference.
  void ExpectServesNormalJob(int64_t first_step) {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = stub_->Reduce(&context);
    auto [oversized, missed] =
        NormalRound(*stream, first_step,
                    RoundContribution("normal", 0, first_step, 1, 8200));
    EXPECT_EQ(NamesLimit(oversized, "max_message_bytes", kMaxMessageBytes), "");
    EXPECT_EQ(missed.status().code(), absl::StatusCode::kDeadlineExceeded)
        << missed.status();
    EXPECT_TRUE(absl::StrContains(missed.status().message(), "[1]"))
        << missed.status();
    for (int64_t step = first_step + 1; step <= first_step + 3; ++step) {
      auto [answer, rank0] = NormalRound(
          *stream, step, RoundContribution("normal", 0, step, 1, 512));
      ASSERT_TRUE(answer.ok()) << answer;
      ASSERT_TRUE(rank0.ok()) << rank0.status();
      EXPECT_EQ(CheckGlobal(rank0->moments(),
                            ReferenceMerge("normal", 0, step, {0, 1}, 512)),
                "")
          << "step " << step;
    }
    ExpectStragglerReported(*stream, first_step + 4);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    auto health = CheckHealth(channel_);
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, 1) << "SERVING";
  }

  std::string dir_;
  std::unique_ptr<LocalAggregator> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  // The abusers of one flood.
  std::unique_ptr<NonReader> dup_;
  std::vector<std::unique_ptr<NonReader>> non_readers_;
  std::unique_ptr<grpc::ClientContext> pend_context_;
  std::unique_ptr<Stream> pend_;
  std::thread pend_reader_;
  absl::Mutex pend_mu_;
  std::vector<absl::Status> pend_answers_ ABSL_GUARDED_BY(pend_mu_);
  std::vector<std::unique_ptr<grpc::ClientContext>> probe_contexts_;
  std::vector<std::unique_ptr<Stream>> probes_;
};

// Two floods, each followed by correct rounds of a normal job and a return
// of the server's memory to near where it started: the second shows that
// nothing accumulates from one flood to the next.
TEST_F(FloodTest, MemoryStaysBoundedAndEveryLimitIsNamed) {
  const absl::Time start = absl::Now();
  WarmUp();
  const int64_t rss_start = RssKb();
  const int64_t bound = rss_start + BoundKb();
  RssSampler sampler(server_->process().pid());
  int64_t in_flood[2], after[2];
  for (int pass = 0; pass < 2; ++pass) {
    in_flood[pass] = Flood();
    ExpectServesNormalJob(10 * pass + 1);
    after[pass] = RssKbOnceAtMost(rss_start + kEndSlackKb, kTrimWait);
  }
  sampler.Stop();
  std::fprintf(stderr,
               "flood: server rss %lld kB warmed up; %lld and %lld kB in the "
               "floods, %lld kB at the peak; %lld and %lld kB after them; "
               "bound %lld kB; %.1f s\n",
               static_cast<long long>(rss_start),
               static_cast<long long>(in_flood[0]),
               static_cast<long long>(in_flood[1]),
               static_cast<long long>(sampler.peak_kb()),
               static_cast<long long>(after[0]),
               static_cast<long long>(after[1]), static_cast<long long>(bound),
               absl::ToDoubleSeconds(absl::Now() - start));
  EXPECT_LE(sampler.peak_kb(), bound);
  // Back near the start once the abusers are gone, after either flood.
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_LE(after[pass], rss_start + kEndSlackKb)
        << "flood " << pass << ": the server held on to "
        << after[pass] - rss_start << " kB";
  }
}

// gRPC 1.51 takes a whole message before its size check. Past
// --max_transport_bytes its quota cancels streams, one at a time, until the
// transport is back under it: the huge message is cut off early and its
// client gets gRPC's RESOURCE_EXHAUSTED. gRPC picks the streams by the age
// of their connection, not by what they hold: a stream opened before, on
// an older connection, is cancelled first, with the same status. A new
// stream then serves correct rounds, and the server stays SERVING. The
// gRPC metrics count the cut stream as cut (Canceled: the server is not
// told why), not as the OK its service ends it with when its reads fail.
TEST_F(FloodTest, MessageOverTheTransportQuotaIsCutOffEarly) {
  const absl::Time start = absl::Now();
  grpc::ClientContext older_context;
  older_context.set_deadline(absl::ToChronoTime(start + absl::Seconds(20)));
  std::unique_ptr<Stream> older = stub_->Reduce(&older_context);
  auto [answer, rank0] =
      NormalRound(*older, 1, RoundContribution("normal", 0, 1, 1, 512));
  ASSERT_TRUE(answer.ok() && rank0.ok()) << answer << rank0.status();
  const int64_t rss_start = RssKb();
  const int64_t bound = rss_start + HugeMessageBoundKb();
  RssSampler sampler(server_->process().pid());
  const absl::Time sent = absl::Now();
  const grpc::Status cut =
      SendRawRequest(server_->address(), kHugeMessageBytes);
  const absl::Duration took = absl::Now() - sent;
  absl::SleepFor(absl::Milliseconds(100));  // a last sample or more
  sampler.Stop();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << cut.error_message();
  EXPECT_LE(sampler.peak_kb(), bound);

  v1::RoundResult r;
  EXPECT_FALSE(older->Read(&r)) << "the older stream was not cancelled";
  const grpc::Status collateral = older->Finish();
  EXPECT_EQ(collateral.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << collateral.error_message();

  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = stub_->Reduce(&context);
  for (int64_t step = 2; step <= 4; ++step) {
    auto [answer, rank0] = NormalRound(
        *stream, step, RoundContribution("normal", 0, step, 1, 512));
    ASSERT_TRUE(answer.ok()) << answer;
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    EXPECT_EQ(CheckGlobal(rank0->moments(),
                          ReferenceMerge("normal", 0, step, {0, 1}, 512)),
              "")
        << "step " << step;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  auto health = CheckHealth(channel_);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1) << "SERVING";

  // Counted once over on the server, a moment after the client knows.
  const int port = MetricsPortFromLog(dir_ + "/aggregator.log");
  ASSERT_GT(port, 0);
  std::string metrics = ScrapeMetrics(port);
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       HandledCalls(metrics, "Reduce") < 2 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(50));
    metrics = ScrapeMetrics(port);
  }
  EXPECT_EQ(HandledCalls(metrics, "Reduce", "OK"), 1) << metrics;
  EXPECT_EQ(HandledCalls(metrics, "Reduce", "Canceled"), 1) << metrics;
  EXPECT_EQ(HandledCalls(metrics, "Reduce"), 2) << metrics;
  std::fprintf(stderr,
               "huge message: %lld MiB cut off after %.2f s (%s); the older "
               "stream: %s; server rss %lld kB before, %lld kB at the peak, "
               "bound %lld kB; %.1f s\n",
               static_cast<long long>(kHugeMessageBytes >> 20),
               absl::ToDoubleSeconds(took), FromGrpc(cut).ToString().c_str(),
               FromGrpc(collateral).ToString().c_str(),
               static_cast<long long>(rss_start),
               static_cast<long long>(sampler.peak_kb()),
               static_cast<long long>(bound),
               absl::ToDoubleSeconds(absl::Now() - start));
}

// ReduceOnce and Checkpoint calls parked waiting (for rounds that lack
// ranks, for steps not committed) up to --max_waiting_calls: one more of
// either is refused at once, naming the flag, and nothing of it is kept: a
// refused contribution does not count in its round (its rank then sends
// another payload, which a recorded one would make ABORTED), a refused
// checkpoint is never cut. Streams are not counted; once the rounds
// complete, every parked call gets its answer and the slots free up.
TEST_F(FloodTest, WaitingCallsAreBoundedAndARefusedOneLosesNothing) {
  constexpr int kChannels = 8;
  constexpr int kParkedRounds = kMaxWaitingCalls - 2;  // + 2 checkpoints
  ASSERT_TRUE(CreateJob(Job("wait", 3, 1, kChannels, 20000)).ok());
  std::vector<absl::StatusOr<v1::RoundResult>> rounds(kParkedRounds);
  std::vector<absl::StatusOr<v1::CheckpointInfo>> checkpoints(2);
  std::vector<std::thread> parked;
  for (int i = 0; i < kParkedRounds; ++i) {
    parked.emplace_back([&, i] {
      rounds[i] = ReduceOnce(RoundContribution("wait", 0, i + 1, 0, kChannels),
                             absl::Seconds(30));
    });
  }
  for (int i = 0; i < 2; ++i) {
    parked.emplace_back([&, i] {
      checkpoints[i] = Checkpoint("wait", i + 1, absl::StrCat("parked", i),
                                  absl::Seconds(30));
    });
  }
  // Full once a call to no job is refused instead of NOT_FOUND (it is
  // counted before the job is looked up, and answered at once). The parked
  // calls go first: a probe in progress holds a slot.
  absl::SleepFor(absl::Seconds(1));
  absl::Status probe;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {
    absl::SleepFor(absl::Milliseconds(50));
    probe = ReduceOnce(RoundContribution("nope", 0, 0, 0, 1), absl::Seconds(5))
                .status();
  } while (probe.code() == absl::StatusCode::kNotFound &&
           absl::Now() < deadline);
  EXPECT_EQ(NamesLimit(probe, "max_waiting_calls", kMaxWaitingCalls), "");

  // Rank 1 of step 1, with a payload of its own, and a checkpoint of step 3.
  v1::Contribution other = RoundContribution("wait", 0, 1, 1, kChannels);
  other.mutable_moments()->set_count(other.moments().count() + 1);
  const absl::Time sent = absl::Now();
  auto refused = ReduceOnce(other, absl::Seconds(10));
  EXPECT_EQ(NamesLimit(refused.status(), "max_waiting_calls", kMaxWaitingCalls),
            "");
  EXPECT_EQ(
      NamesLimit(Checkpoint("wait", 3, "refused", absl::Seconds(10)).status(),
                 "max_waiting_calls", kMaxWaitingCalls),
      "");
  EXPECT_LT(absl::Now() - sent, absl::Seconds(2)) << "refused at once";

  // Ranks 1 and 2 of every parked round, on a stream (not counted): each
  // round completes with the stream's payloads only.
  {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = stub_->Reduce(&context);
    for (int step = 1; step <= kParkedRounds; ++step) {
      for (int rank = 1; rank <= 2; ++rank) {
        ASSERT_TRUE(
            stream->Write(RoundContribution("wait", 0, step, rank, kChannels)));
      }
    }
    for (int i = 0; i < 2 * kParkedRounds; ++i) {
      v1::RoundResult r;
      ASSERT_TRUE(stream->Read(&r));
      EXPECT_TRUE(InBand(r).ok()) << "step " << r.step() << ": " << InBand(r);
      EXPECT_EQ(CheckGlobal(r.moments(), ReferenceMerge("wait", 0, r.step(),
                                                        {0, 1, 2}, kChannels)),
                "")
          << "step " << r.step();
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  for (std::thread& t : parked) t.join();
  for (int i = 0; i < kParkedRounds; ++i) {
    ASSERT_TRUE(rounds[i].ok())
        << "step " << i + 1 << ": " << rounds[i].status();
    EXPECT_EQ(
        CheckGlobal(rounds[i]->moments(),
                    ReferenceMerge("wait", 0, i + 1, {0, 1, 2}, kChannels)),
        "");
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(checkpoints[i].ok()) << checkpoints[i].status();
    EXPECT_EQ(checkpoints[i]->step(), i + 1);
  }

  // Slots free up once the server has let go of the answered calls.
  absl::StatusOr<v1::CheckpointInfo> after;
  const absl::Time again = absl::Now() + absl::Seconds(10);
  do {
    after = Checkpoint("wait", kParkedRounds, "after", absl::Seconds(10));
  } while (after.status().code() == absl::StatusCode::kResourceExhausted &&
           absl::Now() < again);
  EXPECT_TRUE(after.ok()) << after.status();
  v1::ListCheckpointsRequest list_request;
  list_request.set_job_id("wait");
  v1::ListCheckpointsResponse list;
  ASSERT_TRUE(stub_
                  ->ListCheckpoints(Context(absl::Seconds(10)).get(),
                                    list_request, &list)
                  .ok());
  std::vector<int64_t> steps;
  for (const v1::CheckpointInfo& c : list.checkpoints()) {
    EXPECT_NE(c.tag(), "refused");
    steps.push_back(c.step());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, kParkedRounds}));
  auto health = CheckHealth(channel_);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1) << "SERVING";
}

}  // namespace
}  // namespace syncnorm::testing
