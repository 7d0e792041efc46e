// bench-wide-client: W ranks of one job, each with its own TCP connection
// and its own Reduce stream, driven from one process on gRPC's
// asynchronous API (--threads completion queues, one polling thread each).
// Talks to syncnorm's aggregator or to the floor (bench-server --floor),
// which serve the same syncnorm.v1.Aggregator; --server only labels the
// output.
//
// Modes:
//   lockstep   a rank sends (step, layer l + 1) only after its answer to
//              (step, layer l): one contribution in flight per stream.
//   pipelined  a rank sends the L layers of a step, then reads their L
//              answers: L contributions in flight per stream.
// Every answer is checked against a long double merge of every rank's
// payload made here at start; a mismatch, an error answer or a stream that
// ends early is an error, and any error makes the exit status 1.
//
// Prints (stdout):
//   WINDOW_BEGIN        the measured rounds start (after --warmup_steps)
//   WINDOW_END          every measured round was answered; streams open
//   RESULT {json}       percentiles over the measured rounds
// With --handshake it waits for a line on stdin after each WINDOW_ line,
// so that a driver can read the processes' counters at those moments.
// A round is one (step, layer): its round time runs from its first rank's
// send to its last rank's answer, its completion time from its last rank's
// send (the write issued) to its last answer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, server, "syncnorm", "label of the server in RESULT");
ABSL_FLAG(std::string, job, "wide", "job id (unique per run)");
ABSL_FLAG(std::string, mode, "lockstep", "lockstep | pipelined");
ABSL_FLAG(int, world, 8, "ranks W (streams and connections)");
ABSL_FLAG(int, layers, 1, "layers L");
ABSL_FLAG(int, channels, 256, "channels C per layer");
ABSL_FLAG(int, steps, 100, "measured steps (rounds = steps x layers)");
ABSL_FLAG(int, warmup_steps, 2, "unmeasured steps first");
ABSL_FLAG(int, threads, 1, "completion queues, one polling thread each");
ABSL_FLAG(uint64_t, seed, 1, "seed of the payloads");
ABSL_FLAG(bool, handshake, false, "wait for a stdin line after WINDOW_ lines");
ABSL_FLAG(std::string, relays, "",
          "relay addresses, comma-separated: rank r's rounds go to relay "
          "r * R / W (R relays, each a contiguous run of ranks); the job is "
          "still created at --address");
ABSL_FLAG(bool, disable_stats_health, false,
          "create the job with statistics health off");
ABSL_FLAG(double, timeout_s, 300, "give up (errors) after this long");

namespace syncnorm::bench {
namespace {

using Clock = std::chrono::steady_clock;
using v1::Contribution;
using v1::RoundResult;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

// The merged statistics every answer must carry.
struct Reference {
  int64_t count = 0;
  std::vector<double> mean;
  std::vector<double> var;  // biased
};

// Each channel's distribution, the same for every rank: a mean in [1, 3)
// and a variance in [0.25, 1.25).
struct Distribution {
  std::vector<double> mean, var;
};

Distribution ChannelDistribution(uint64_t seed, int channels) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Distribution d;
  for (int c = 0; c < channels; ++c) {
    d.mean.push_back(1.0 + 2.0 * u(rng));
    d.var.push_back(0.25 + u(rng));
  }
  return d;
}

// Rank `rank`'s payload: a seeded count (different per rank) and, per
// channel, the mean and M2 of that many samples of the channel's
// distribution as their sampling spread has them (so that the server's
// statistics health sees ranks that agree, as in training).
void FillPayload(uint64_t seed, int rank, const Distribution& d,
                 v1::Moments* m) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + rank + 1);
  std::normal_distribution<double> z(0.0, 1.0);
  const int64_t count = 16 + static_cast<int64_t>(rng() % 1009);
  const int channels = static_cast<int>(d.mean.size());
  m->set_count(count);
  m->mutable_mean()->Reserve(channels);
  m->mutable_m2()->Reserve(channels);
  for (int c = 0; c < channels; ++c) {
    m->add_mean(d.mean[c] + std::sqrt(d.var[c] / count) * z(rng));
  }
  const double spread = std::sqrt(2.0 / (count - 1));
  for (int c = 0; c < channels; ++c) {
    const double f = std::max(0.1, 1.0 + spread * z(rng));
    m->add_m2(d.var[c] * (count - 1) * f);
  }
}

// The parallel (two-pass) merge in long double, independent of the Chan
// fold the servers run: n = sum n_r, mean = sum n_r mean_r / n,
// M2 = sum M2_r + sum n_r (mean_r - mean)^2.
Reference Merge(const std::vector<const v1::Moments*>& ranks, int channels) {
  long double n = 0;
  std::vector<long double> sum(channels, 0), m2(channels, 0);
  Reference ref;
  for (const v1::Moments* m : ranks) {
    ref.count += m->count();
    n += m->count();
    const long double count = m->count();
    for (int c = 0; c < channels; ++c) sum[c] += count * m->mean(c);
  }
  for (int c = 0; c < channels; ++c) sum[c] /= n;  // now the mean
  for (const v1::Moments* m : ranks) {
    const long double count = m->count();
    for (int c = 0; c < channels; ++c) {
      const long double d = m->mean(c) - sum[c];
      m2[c] += m->m2(c) + count * d * d;
    }
  }
  for (int c = 0; c < channels; ++c) {
    ref.mean.push_back(static_cast<double>(sum[c]));
    ref.var.push_back(static_cast<double>(m2[c] / n));
  }
  return ref;
}

bool Close(double got, double want) {
  return std::fabs(got - want) <= 1e-9 * std::fabs(want);
}

// Per round (measured ones), the instants that make its times; each
// polling thread keeps its own and they are combined at the end.
struct RoundMarks {
  explicit RoundMarks(int64_t rounds)
      : first_send(rounds, std::numeric_limits<int64_t>::max()),
        last_send(rounds, 0),
        last_answer(rounds, 0) {}
  std::vector<int64_t> first_send, last_send, last_answer;
};

// What one polling thread owns: its marks, its errors and the last answer
// it verified in full (answers equal to it byte for byte pass at once: a
// deterministic server answers every round of this run alike).
struct ThreadState {
  explicit ThreadState(int64_t rounds) : marks(rounds) {}
  RoundMarks marks;
  std::atomic<int64_t> errors{0};  // read by main
  int64_t checked_in_full = 0;
  std::vector<double> verified_mean, verified_var;
};

// One rank: its connection, stream and payload. Touched only by the
// thread that polls its completion queue (and by main before it starts).
struct Rank {
  enum class Op { kStart, kRead, kWrite, kWritesDone, kFinish, kKick };
  struct Tag {
    Rank* rank;
    Op op;
  };
  int index = 0;
  grpc::CompletionQueue* cq = nullptr;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Aggregator::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<Contribution, RoundResult>>
      stream;
  Contribution out;
  RoundResult in;
  grpc::Status status;
  int64_t sent = 0;             // contributions written (round k next)
  int64_t answered = 0;         // answers read
  uint64_t group_answered = 0;  // bit per round of the current group
  bool writing = false;
  bool closing = false;
  bool failed = false;
  Tag start{this, Op::kStart}, read{this, Op::kRead}, write{this, Op::kWrite},
      writes_done{this, Op::kWritesDone}, finish{this, Op::kFinish};
};

// The whole run: the ranks, the three phases they pass together (warm-up,
// measured rounds, close), and the marks. Thread-safe as used: main starts
// a phase (Begin*) only when every rank has stopped at the last one.
class Run {
 public:
  enum Phase { kWarmup, kMeasured, kClose, kPhases };

  Run(int world, int layers, int channels, bool pipelined, int64_t warmup,
      int64_t measured, int threads)
      : world_(world),
        layers_(layers),
        channels_(channels),
        group_(pipelined ? layers : 1),
        warmup_rounds_(warmup),
        total_rounds_(warmup + measured),
        kick_tag_{nullptr, Rank::Op::kKick} {
    for (int t = 0; t < threads; ++t) {
      cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
      states_.push_back(std::make_unique<ThreadState>(measured));
    }
  }

  std::vector<std::unique_ptr<Rank>>& ranks() { return ranks_; }
  const std::vector<std::unique_ptr<Rank>>& ranks() const { return ranks_; }
  grpc::CompletionQueue* cq(int i) { return cqs_[i % cqs_.size()].get(); }
  Reference& reference() { return reference_; }

  void StartThreads() {
    for (size_t t = 0; t < cqs_.size(); ++t) {
      pollers_.emplace_back([this, t] { Poll(t); });
    }
  }

  // true when every rank finished phase `p` by `deadline`; false when one
  // failed or time ran out.
  bool WaitPhase(Phase p, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    while (at_end_[p] < world_ && !failed_) {
      if (ended_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
    }
    return at_end_[p] == world_ && !failed_;
  }

  // Lets every rank run to the last round.
  void BeginMeasured() { Kick(kMeasured); }
  // Ends every stream (WritesDone, then its status).
  void BeginClose() { Kick(kClose); }

  int64_t errors() const {
    int64_t n = 0;
    for (auto& s : states_) n += s->errors.load(std::memory_order_relaxed);
    return n;
  }
  int64_t checked_in_full() const {
    int64_t n = 0;
    for (auto& s : states_) n += s->checked_in_full;
    return n;
  }
  int64_t answer_bytes() const { return answer_bytes_.load(); }
  // Every thread's marks together. REQUIRES: the close phase finished.
  RoundMarks Combined() const;

 private:
  int64_t limit() const {
    return phase_.load() == kWarmup ? warmup_rounds_ : total_rounds_;
  }
  void Kick(Phase p) {
    phase_.store(p);
    for (auto& cq : cqs_) {
      kicks_.push_back(std::make_unique<grpc::Alarm>());
      kicks_.back()->Set(cq.get(), gpr_now(GPR_CLOCK_MONOTONIC), &kick_tag_);
    }
  }
  void Poll(size_t t);
  void Handle(size_t t, Rank::Tag* tag, bool ok);
  void OnKick(size_t t);
  void OnWriteDone(ThreadState& st, Rank& r, bool ok);
  void MaybeWrite(ThreadState& st, Rank& r);
  void OnAnswer(ThreadState& st, Rank& r);
  bool Check(ThreadState& st, const RoundResult& a);
  void Fail(ThreadState& st, Rank& r, const std::string& what);
  void ReachedEnd() {
    absl::MutexLock lock(&mu_);
    if (++at_end_[phase_.load()] == world_) ended_.SignalAll();
  }

  const int world_, layers_, channels_, group_;
  const int64_t warmup_rounds_, total_rounds_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::unique_ptr<ThreadState>> states_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::thread> pollers_;
  std::vector<std::unique_ptr<grpc::Alarm>> kicks_;  // main's only
  Rank::Tag kick_tag_;
  std::atomic<int> phase_{kWarmup};
  absl::Mutex mu_;
  int at_end_[kPhases] ABSL_GUARDED_BY(mu_) = {};  // ranks done, per phase
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar ended_;  // a phase ended or a rank failed
  std::atomic<int64_t> answer_bytes_{0};
  Reference reference_;
};

void Run::Poll(size_t t) {
  void* tag = nullptr;
  bool ok = false;
  while (cqs_[t]->Next(&tag, &ok)) Handle(t, static_cast<Rank::Tag*>(tag), ok);
}

void Run::Handle(size_t t, Rank::Tag* tag, bool ok) {
  ThreadState& st = *states_[t];
  if (tag->op == Rank::Op::kKick) return OnKick(t);
  Rank& r = *tag->rank;
  switch (tag->op) {
    case Rank::Op::kStart:
      if (!ok) return Fail(st, r, "stream did not start");
      r.stream->Read(&r.in, &r.read);
      return MaybeWrite(st, r);
    case Rank::Op::kWrite:
      return OnWriteDone(st, r, ok);
    case Rank::Op::kRead:
      if (ok) {
        OnAnswer(st, r);
        r.stream->Read(&r.in, &r.read);
        return MaybeWrite(st, r);
      }
      if (!r.closing) return Fail(st, r, "stream ended early");
      r.stream->Finish(&r.status, &r.finish);
      return;
    case Rank::Op::kWritesDone:
      return;  // the read that ends follows
    case Rank::Op::kFinish:
      if (!r.status.ok()) {
        std::fprintf(stderr, "rank %d: stream closed with %d %s\n", r.index,
                     r.status.error_code(), r.status.error_message().c_str());
        st.errors.fetch_add(1, std::memory_order_relaxed);
      }
      return ReachedEnd();
    case Rank::Op::kKick:
      return;
  }
}

// Thread t's ranks, at the start of a phase: every one has stopped.
void Run::OnKick(size_t t) {
  ThreadState& st = *states_[t];
  for (size_t i = t; i < ranks_.size(); i += cqs_.size()) {
    Rank& r = *ranks_[i];
    if (r.failed) continue;
    if (phase_.load() != kClose) {
      MaybeWrite(st, r);
      continue;
    }
    r.closing = true;
    // A write's completion may still be queued: WritesDone waits for it.
    if (!r.writing) r.stream->WritesDone(&r.writes_done);
  }
}

void Run::OnWriteDone(ThreadState& st, Rank& r, bool ok) {
  r.writing = false;
  if (!ok) return Fail(st, r, "write failed");
  if (r.closing) {
    r.stream->WritesDone(&r.writes_done);
    return;
  }
  MaybeWrite(st, r);
}

// Sends round r.sent when the phase allows it and the mode does: every
// answer of the earlier groups (lock-step: every answer) is in.
void Run::MaybeWrite(ThreadState& st, Rank& r) {
  if (r.writing || r.failed || r.closing || r.sent >= limit()) return;
  if (r.answered < r.sent / group_ * group_) return;
  const int64_t k = r.sent++;
  r.out.set_step(k / layers_);
  r.out.set_layer(static_cast<int>(k % layers_));
  r.writing = true;
  const int64_t now = NowNanos();
  r.stream->Write(r.out, &r.write);
  const int64_t m = k - warmup_rounds_;
  if (m < 0) return;
  st.marks.first_send[m] = std::min(st.marks.first_send[m], now);
  st.marks.last_send[m] = std::max(st.marks.last_send[m], now);
}

void Run::OnAnswer(ThreadState& st, Rank& r) {
  const int64_t now = NowNanos();
  const RoundResult& a = r.in;
  const int64_t k = a.step() * layers_ + a.layer();
  const int64_t bit = k - r.answered / group_ * group_;
  if (a.layer() < 0 || a.layer() >= layers_ || bit < 0 || bit >= group_ ||
      k >= r.sent || (r.group_answered >> bit & 1)) {
    return Fail(st, r,
                absl::StrCat("unexpected answer (step ", a.step(), ", layer ",
                             a.layer(), ")"));
  }
  r.group_answered |= uint64_t{1} << bit;
  if (++r.answered % group_ == 0) r.group_answered = 0;
  if (answer_bytes_.load(std::memory_order_relaxed) == 0) {
    answer_bytes_.store(static_cast<int64_t>(a.ByteSizeLong()));
  }
  if (!Check(st, a) && st.errors.fetch_add(1, std::memory_order_relaxed) < 5) {
    std::fprintf(stderr, "rank %d: round (step %lld, layer %d) wrong: %s\n",
                 r.index, static_cast<long long>(a.step()), a.layer(),
                 a.has_error() ? a.error().message().c_str()
                               : "statistics differ from the reference");
  }
  const int64_t m = k - warmup_rounds_;
  if (m >= 0) st.marks.last_answer[m] = std::max(st.marks.last_answer[m], now);
  if (r.answered == limit()) ReachedEnd();
}

bool Run::Check(ThreadState& st, const RoundResult& a) {
  if (!a.has_moments()) return false;
  const v1::GlobalMoments& g = a.moments();
  const size_t c = channels_;
  if (g.count() != reference_.count || g.mean_size() != channels_ ||
      g.var_size() != channels_) {
    return false;
  }
  if (st.verified_mean.size() == c &&
      std::memcmp(g.mean().data(), st.verified_mean.data(), c * 8) == 0 &&
      std::memcmp(g.var().data(), st.verified_var.data(), c * 8) == 0) {
    return true;
  }
  for (size_t i = 0; i < c; ++i) {
    if (!Close(g.mean(i), reference_.mean[i]) ||
        !Close(g.var(i), reference_.var[i])) {
      return false;
    }
  }
  ++st.checked_in_full;
  st.verified_mean.assign(g.mean().begin(), g.mean().end());
  st.verified_var.assign(g.var().begin(), g.var().end());
  return true;
}

// Ends the run: main stops waiting, whatever the phase.
void Run::Fail(ThreadState& st, Rank& r, const std::string& what) {
  r.failed = true;
  st.errors.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "rank %d: %s\n", r.index, what.c_str());
  absl::MutexLock lock(&mu_);
  failed_ = true;
  ended_.SignalAll();
}

RoundMarks Run::Combined() const {
  RoundMarks all(total_rounds_ - warmup_rounds_);
  for (auto& s : states_) {
    for (size_t m = 0; m < all.first_send.size(); ++m) {
      all.first_send[m] = std::min(all.first_send[m], s->marks.first_send[m]);
      all.last_send[m] = std::max(all.last_send[m], s->marks.last_send[m]);
      all.last_answer[m] =
          std::max(all.last_answer[m], s->marks.last_answer[m]);
    }
  }
  return all;
}

// As bench/common.py's percentile: linear between the closest ranks.
double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double k = (v.size() - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(k);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (k - lo);
}

std::string Target(const std::string& address) {
  // An IP literal goes to the sockaddr resolver, not to DNS.
  if (!address.empty() && address[0] >= '0' && address[0] <= '9') {
    return "ipv4:" + address;
  }
  return address;
}

// Where rank `index` (of `world`) sends its rounds: its relay, or the
// server.
std::string RoundAddress(int index, int world) {
  const std::string relays = absl::GetFlag(FLAGS_relays);
  if (relays.empty()) return absl::GetFlag(FLAGS_address);
  const std::vector<std::string> list = absl::StrSplit(relays, ',');
  return list[static_cast<int64_t>(index) * list.size() / world];
}

// Rank `index`'s own connection: distinct channel arguments and a local
// subchannel pool keep channels from sharing one.
std::shared_ptr<grpc::Channel> NewChannel(int index) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.channel_id", index);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // As client/client.cc: a round's message fits the stream window.
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return grpc::CreateCustomChannel(
      Target(RoundAddress(index, absl::GetFlag(FLAGS_world))),
      grpc::InsecureChannelCredentials(), args);
}

bool CreateJob(v1::Aggregator::Stub& stub) {
  v1::CreateJobRequest req;
  req.set_job_id(absl::GetFlag(FLAGS_job));
  req.set_world_size(absl::GetFlag(FLAGS_world));
  req.set_round_timeout_ms(120000);
  req.set_disable_stats_health(absl::GetFlag(FLAGS_disable_stats_health));
  for (int l = 0; l < absl::GetFlag(FLAGS_layers); ++l) {
    req.add_layers()->set_num_features(absl::GetFlag(FLAGS_channels));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  ctx.set_wait_for_ready(true);
  v1::JobInfo info;
  const grpc::Status st = stub.CreateJob(&ctx, req, &info);
  if (!st.ok()) {
    std::fprintf(stderr, "CreateJob: %s\n", st.error_message().c_str());
  }
  return st.ok();
}

// Makes every rank's channel, payload and stream (not started), and the
// reference.
void BuildRanks(Run& run) {
  const int world = absl::GetFlag(FLAGS_world);
  const int channels = absl::GetFlag(FLAGS_channels);
  const Distribution d =
      ChannelDistribution(absl::GetFlag(FLAGS_seed), channels);
  std::vector<const v1::Moments*> payloads;
  for (int i = 0; i < world; ++i) {
    auto r = std::make_unique<Rank>();
    r->index = i;
    r->cq = run.cq(i);
    r->channel = NewChannel(i);
    r->stub = v1::Aggregator::NewStub(r->channel);
    r->out.set_job_id(absl::GetFlag(FLAGS_job));
    r->out.set_phase(v1::FORWARD);
    r->out.set_rank(i);
    FillPayload(absl::GetFlag(FLAGS_seed), i, d, r->out.mutable_moments());
    payloads.push_back(&r->out.moments());
    run.ranks().push_back(std::move(r));
  }
  run.reference() = Merge(payloads, channels);
}

void Handshake(const char* line) {
  std::printf("%s\n", line);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_handshake)) return;
  std::string ack;
  std::getline(std::cin, ack);
}

// One JSON object; the percentiles are NaN (null) unless `finished`.
void PrintResult(const Run& run, bool finished, int64_t measured,
                 double seconds, double connect_seconds) {
  std::vector<double> round_ms, completion_ms;
  if (finished) {
    const RoundMarks marks = run.Combined();
    for (int64_t m = 0; m < measured; ++m) {
      round_ms.push_back((marks.last_answer[m] - marks.first_send[m]) / 1e6);
      completion_ms.push_back((marks.last_answer[m] - marks.last_send[m]) /
                              1e6);
    }
  }
  const auto ms = [](double v) {
    return std::isnan(v) ? std::string("null") : absl::StrCat(v);
  };
  const int world = absl::GetFlag(FLAGS_world);
  const std::string json = absl::StrCat(
      "{\"server\": \"", absl::GetFlag(FLAGS_server), "\", \"W\": ", world,
      ", \"L\": ", absl::GetFlag(FLAGS_layers),
      ", \"C\": ", absl::GetFlag(FLAGS_channels), ", \"mode\": \"",
      absl::GetFlag(FLAGS_mode), "\", \"rounds\": ", measured,
      ", \"contributions\": ", measured * world, ", \"seconds\": ", seconds,
      ", \"round_p50_ms\": ", ms(Percentile(round_ms, 50)),
      ", \"round_p99_ms\": ", ms(Percentile(round_ms, 99)),
      ", \"completion_p50_ms\": ", ms(Percentile(completion_ms, 50)),
      ", \"completion_p99_ms\": ", ms(Percentile(completion_ms, 99)),
      ", \"errors\": ", run.errors(),
      ", \"checked_in_full\": ", run.checked_in_full(),
      ", \"connect_seconds\": ", connect_seconds,
      ", \"request_bytes\": ", run.ranks()[0]->out.ByteSizeLong(),
      ", \"answer_bytes\": ", run.answer_bytes(), "}");
  std::printf("RESULT %s\n", json.c_str());
  std::fflush(stdout);
}

int Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int layers = absl::GetFlag(FLAGS_layers);
  if ((mode != "lockstep" && mode != "pipelined") || layers < 1 ||
      layers > 64 || absl::GetFlag(FLAGS_world) < 1 ||
      absl::GetFlag(FLAGS_warmup_steps) < 1 || absl::GetFlag(FLAGS_steps) < 1) {
    std::fprintf(stderr,
                 "need --mode lockstep or pipelined, 1 <= --layers <= 64, "
                 "--world, --steps and --warmup_steps >= 1\n");
    return 2;
  }
  const int64_t measured = int64_t{absl::GetFlag(FLAGS_steps)} * layers;
  Run run(absl::GetFlag(FLAGS_world), layers, absl::GetFlag(FLAGS_channels),
          mode == "pipelined",
          int64_t{absl::GetFlag(FLAGS_warmup_steps)} * layers, measured,
          std::max(1, absl::GetFlag(FLAGS_threads)));
  BuildRanks(run);
  {
    // At the server itself: a relay serves rounds only.
    auto server = v1::Aggregator::NewStub(
        grpc::CreateChannel(Target(absl::GetFlag(FLAGS_address)),
                            grpc::InsecureChannelCredentials()));
    if (!CreateJob(*server)) return 1;
  }
  const absl::Time deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  const absl::Time t0 = absl::Now();
  run.StartThreads();
  for (auto& r : run.ranks()) {
    r->stream = r->stub->PrepareAsyncReduce(&r->ctx, r->cq);
    r->stream->StartCall(&r->start);
  }
  // Every stream started and ran the warm-up rounds.
  bool ok = run.WaitPhase(Run::kWarmup, deadline);
  const double connect_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  double seconds = 0;
  if (ok) {
    Handshake("WINDOW_BEGIN");
    const absl::Time t1 = absl::Now();
    run.BeginMeasured();
    ok = run.WaitPhase(Run::kMeasured, deadline);
    seconds = absl::ToDoubleSeconds(absl::Now() - t1);
  }
  if (ok) {
    Handshake("WINDOW_END");
    run.BeginClose();
    ok = run.WaitPhase(Run::kClose, absl::Now() + absl::Seconds(30));
  }
  if (!ok) std::fprintf(stderr, "bench-wide-client: the run did not finish\n");
  PrintResult(run, ok, measured, seconds, connect_seconds);
  // Tearing down W channels takes long and measures nothing.
  std::_Exit(ok && run.errors() == 0 ? 0 : 1);
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil checks lock order on every acquisition (server/main.cc).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return syncnorm::bench::Main();
}
