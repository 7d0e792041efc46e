// bench-server: the reference services of the round-latency and throughput
// benchmarks (see bench.proto). Echo and Lean use gRPC's callback API, Star
// the synchronous API with a thread per stream, as a naive aggregator would.
// With --floor it serves only the floor of the many-rank benchmark instead:
// syncnorm.v1.Aggregator's CreateJob and Reduce, gather and merge only.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/moments.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, port_file, "", "the bound port is written here");
ABSL_FLAG(int, cq_threads, 0,
          "> 0: serve only Lean, on gRPC's asynchronous API with this many "
          "completion queues, each polled by one thread that handles what it "
          "returns (no hand-off to a callback thread; with more than one "
          "queue the threads hand events to each other again)");
ABSL_FLAG(bool, floor, false,
          "serve only the floor: syncnorm.v1.Aggregator's CreateJob and "
          "Reduce, gathering and merging, nothing else");

namespace syncnorm::bench {
namespace {

class EchoReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  EchoReactor() { StartRead(&blob_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&blob_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&blob_);
  }
  void OnDone() override { delete this; }

 private:
  Blob blob_;
};

class EchoService final : public Echo::CallbackService {
  grpc::ServerBidiReactor<Blob, Blob>* PingPong(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

Moments ToMoments(const Blob& b) {
  const int c = b.values_size() / 2;
  Moments m;
  m.count = b.count();
  m.mean.assign(b.values().begin(), b.values().begin() + c);
  m.m2.assign(b.values().begin() + c, b.values().end());
  return m;
}

// Merges a round's Blobs (Chan, rank order) into the answer.
Blob Answer(int64_t round, const std::vector<Moments>& by_rank) {
  Moments merged = by_rank[0];
  for (size_t i = 1; i < by_rank.size(); ++i) MergeMoments(merged, by_rank[i]);
  const GlobalMoments g = Finalize(merged);
  Blob answer;
  answer.set_round(round);
  answer.set_count(g.count);
  answer.mutable_values()->Reserve(static_cast<int>(2 * g.mean.size()));
  for (double v : g.mean) answer.add_values(v);
  for (double v : g.var) answer.add_values(v);
  return answer;
}

// The rounds of Lean in progress, on either API: each Blob by rank until
// the round's last arrives, which gets the streams to answer and the
// answer.
template <typename Stream>
class LeanRounds {
 public:
  struct Done {
    std::vector<Stream*> streams;
    std::shared_ptr<const Blob> answer;
  };

  // nullopt until `in` completes its round.
  std::optional<Done> Arrive(Stream* stream, const Blob& in) {
    const int64_t round = in.round();
    std::vector<Moments> by_rank;
    Done done;
    {
      absl::MutexLock lock(&mu_);
      Pending& p = pending_[round];
      const int world = std::max(1, in.world());
      if (p.by_rank.empty()) {
        p.by_rank.resize(world);
        p.streams.resize(world);
      }
      const int rank = in.rank() % world;
      p.by_rank[rank] = ToMoments(in);
      p.streams[rank] = stream;
      if (++p.arrived < world) return std::nullopt;
      done.streams = std::move(p.streams);
      by_rank = std::move(p.by_rank);
      pending_.erase(round);
    }
    done.answer = std::make_shared<const Blob>(Answer(round, by_rank));
    return done;
  }

 private:
  struct Pending {
    std::vector<Moments> by_rank;
    std::vector<Stream*> streams;
    int arrived = 0;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

class LeanService;

// One Lean stream: read, wait for the round, write the shared answer and
// read the next Blob at once (so that gRPC's window update leaves with the
// answer, as syncnorm's server does).
class LeanReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  explicit LeanReactor(LeanService* service) : service_(service) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override;
  // The round of this stream's Blob finished; called once per Blob read.
  void Reply(std::shared_ptr<const Blob> answer) {
    {
      absl::MutexLock lock(&mu_);
      if (answer_ != nullptr) {  // the last answer's write is not done
        queued_ = std::move(answer);
      } else {
        answer_ = std::move(answer);
        StartWrite(answer_.get());
      }
    }
    StartRead(&in_);  // in_ was consumed when it arrived
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    absl::MutexLock lock(&mu_);
    answer_ = std::move(queued_);
    if (answer_ != nullptr) StartWrite(answer_.get());
  }
  void OnDone() override { delete this; }

 private:
  LeanService* const service_;
  Blob in_;
  absl::Mutex mu_;
  // The answer being written, and the next (a client may send its next
  // Blob as soon as it reads an answer, before OnWriteDone runs here).
  std::shared_ptr<const Blob> answer_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Blob> queued_ ABSL_GUARDED_BY(mu_);
};

// A stream that ends while its round waits is not supported (the benchmark
// closes its streams after their last answer).
class LeanService final : public Lean::CallbackService {
 public:
  grpc::ServerBidiReactor<Blob, Blob>* Round(
      grpc::CallbackServerContext*) override {
    return new LeanReactor(this);
  }

  void Arrive(LeanReactor* reactor, const Blob& in) {
    if (auto done = rounds_.Arrive(reactor, in)) {
      for (LeanReactor* r : done->streams) r->Reply(done->answer);
    }
  }

 private:
  LeanRounds<LeanReactor> rounds_;
};

void LeanReactor::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status::OK);
    return;
  }
  service_->Arrive(this, in_);
}

// Lean on the asynchronous API: the threads that poll the completion queue
// run the rounds themselves, where the callback API hands each event from
// its poller to another thread.
// As with LeanService, a stream must end after its last answer.
class AsyncLean {
  struct Stream;

 public:
  // Shared by every queue's AsyncLean.
  using Rounds = LeanRounds<Stream>;

  AsyncLean(Lean::AsyncService* service, grpc::ServerCompletionQueue* cq,
            Rounds* rounds)
      : service_(service), cq_(cq), rounds_(rounds) {}

  void Accept() {
    auto* s = new Stream;
    service_->RequestRound(&s->ctx, &s->rw, cq_, cq_, &s->accept);
  }

  // Runs the completion queue until it shuts down.
  void Run() {
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) Handle(static_cast<Tag*>(tag), ok);
  }

 private:
  enum class Op { kAccept, kRead, kWrite, kFinish };
  struct Tag {
    Stream* stream;
    Op op;
  };
  struct Stream {
    grpc::ServerContext ctx;
    grpc::ServerAsyncReaderWriter<Blob, Blob> rw{&ctx};
    Blob in;
    Tag accept{this, Op::kAccept};
    Tag read{this, Op::kRead};
    Tag write{this, Op::kWrite};
    Tag finish{this, Op::kFinish};
    absl::Mutex mu;
    std::shared_ptr<const Blob> answer ABSL_GUARDED_BY(mu);
    std::shared_ptr<const Blob> queued ABSL_GUARDED_BY(mu);
    bool closing ABSL_GUARDED_BY(mu) = false;
  };

  void Handle(Tag* tag, bool ok) {
    Stream* s = tag->stream;
    switch (tag->op) {
      case Op::kAccept:
        if (!ok) {
          delete s;
          return;
        }
        Accept();
        s->rw.Read(&s->in, &s->read);
        return;
      case Op::kRead: {
        if (ok) {
          Arrive(s);
          return;
        }
        absl::MutexLock lock(&s->mu);
        s->closing = true;
        if (s->answer == nullptr) s->rw.Finish(grpc::Status::OK, &s->finish);
        return;
      }
      case Op::kWrite: {
        absl::MutexLock lock(&s->mu);
        s->answer = ok ? std::move(s->queued) : nullptr;
        if (s->answer != nullptr) {
          s->rw.Write(*s->answer, &s->write);
        } else if (s->closing || !ok) {
          s->rw.Finish(ok ? grpc::Status::OK : grpc::Status::CANCELLED,
                       &s->finish);
        }
        return;
      }
      case Op::kFinish:
        delete s;
        return;
    }
  }

  void Arrive(Stream* s) {
    std::optional<Rounds::Done> done = rounds_->Arrive(s, s->in);
    if (!done.has_value()) return;
    for (Stream* w : done->streams) {
      absl::MutexLock lock(&w->mu);
      if (w->answer != nullptr) {
        w->queued = done->answer;
      } else {
        w->answer = done->answer;
        w->rw.Write(*w->answer, &w->write);
      }
      w->rw.Read(&w->in, &w->read);  // its Blob was consumed on arrival
    }
  }

  Lean::AsyncService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  Rounds* const rounds_;
};

// One round of the star: contributions by rank, then the answer.
struct StarRound {
  std::vector<Moments> by_rank;
  int arrived = 0;
  int taken = 0;
  bool done = false;
  Blob answer;
};

class StarService final : public Star::Service {
 public:
  grpc::Status Round(grpc::ServerContext*,
                     grpc::ServerReaderWriter<Blob, Blob>* stream) override {
    Blob in;
    while (stream->Read(&in)) {
      if (!stream->Write(Gather(in))) break;
    }
    return grpc::Status::OK;
  }

 private:
  // Blocks this stream's thread until every rank of the round arrived; the
  // last one merges (Chan, rank order) for everyone.
  Blob Gather(const Blob& in) {
    absl::MutexLock lock(&mu_);
    StarRound& r = rounds_[in.round()];
    const int world = in.world();
    if (r.by_rank.empty()) r.by_rank.resize(world);
    r.by_rank[in.rank() % world] = ToMoments(in);
    if (++r.arrived == world) {
      r.answer = Answer(in.round(), r.by_rank);
      r.done = true;
    } else {
      mu_.Await(absl::Condition(&r.done));
    }
    Blob out = r.answer;
    if (++r.taken == world) rounds_.erase(in.round());
    return out;
  }

  absl::Mutex mu_;
  std::map<int64_t, StarRound> rounds_ ABSL_GUARDED_BY(mu_);
};

// ---- The floor (--floor) -----------------------------------------------

class FloorReactor;

// The least syncnorm.v1.Aggregator a many-rank round can run on: CreateJob
// records the job's world size; Reduce gathers each (job, layer, step,
// phase)'s W contributions, merges them in rank order (Chan) when the last
// arrives and answers every rank with the same RoundResult. No store, no
// validation beyond what keeps it from reading out of bounds, no metrics.
// FORWARD only. As with Lean, a stream must end after its last answer.
class FloorService final : public v1::Aggregator::CallbackService {
 public:
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const v1::CreateJobRequest* req,
                                      v1::JobInfo* info) override;
  grpc::ServerBidiReactor<v1::Contribution, v1::RoundResult>* Reduce(
      grpc::CallbackServerContext*) override;

  // Takes `in` (leaving it empty); answers the round's streams when `in`
  // completes it.
  void Arrive(FloorReactor* stream, v1::Contribution* in);

 private:
  struct Pending {
    std::vector<v1::Contribution> by_rank;
    std::vector<FloorReactor*> streams;
    int arrived = 0;
  };
  using Key = std::tuple<std::string, int, int64_t, int>;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> worlds_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

// One Reduce stream of the floor: reads as fast as contributions come and
// writes answers in the order their rounds complete. It finishes once the
// client has closed its side and every contribution read was answered (so
// no round holds it after OnDone).
class FloorReactor
    : public grpc::ServerBidiReactor<v1::Contribution, v1::RoundResult> {
 public:
  explicit FloorReactor(FloorService* service) : service_(service) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinish();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      ++unanswered_;
    }
    service_->Arrive(this, &in_);
    StartRead(&in_);
  }
  // The round of one of this stream's contributions completed.
  void Reply(std::shared_ptr<const v1::RoundResult> answer) {
    absl::MutexLock lock(&mu_);
    if (broken_) {
      --unanswered_;
      MaybeFinish();
      return;
    }
    queue_.push_back(std::move(answer));
    if (queue_.size() == 1) StartWrite(queue_.front().get());
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    --unanswered_;
    if (!ok) {  // the call is gone: the rest are dropped
      broken_ = true;
      unanswered_ -= static_cast<int64_t>(queue_.size());
      queue_.clear();
    }
    if (!queue_.empty()) StartWrite(queue_.front().get());
    MaybeFinish();
  }
  void OnDone() override { delete this; }

 private:
  void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || unanswered_ > 0 || !(reads_done_ || broken_)) return;
    finished_ = true;
    Finish(broken_ ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  FloorService* const service_;
  v1::Contribution in_;
  absl::Mutex mu_;
  // Answers to write, the first being written.
  std::deque<std::shared_ptr<const v1::RoundResult>> queue_
      ABSL_GUARDED_BY(mu_);
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // read, answer not written
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* FloorService::CreateJob(
    grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* req,
    v1::JobInfo* info) {
  {
    absl::MutexLock lock(&mu_);
    worlds_[req->job_id()] = std::max(1, req->world_size());
  }
  info->set_job_id(req->job_id());
  info->set_world_size(req->world_size());
  *info->mutable_layers() = req->layers();
  info->set_committed_step(-1);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<v1::Contribution, v1::RoundResult>*
FloorService::Reduce(grpc::CallbackServerContext*) {
  return new FloorReactor(this);
}

void ToMoments(const v1::Moments& m, Moments* out) {
  out->count = m.count();
  out->mean.assign(m.mean().begin(), m.mean().end());
  out->m2.assign(m.m2().begin(), m.m2().end());
}

// The round's answer: the rank-order Chan merge of `by_rank`, or an error
// when their channel counts differ (which the merge cannot take).
std::shared_ptr<const v1::RoundResult> FloorAnswer(
    const std::vector<v1::Contribution>& by_rank) {
  const v1::Contribution& first = by_rank[0];
  auto answer = std::make_shared<v1::RoundResult>();
  answer->set_job_id(first.job_id());
  answer->set_layer(first.layer());
  answer->set_step(first.step());
  answer->set_phase(first.phase());
  const int channels = first.moments().mean_size();
  for (const v1::Contribution& c : by_rank) {
    if (c.moments().mean_size() != channels ||
        c.moments().m2_size() != channels) {
      answer->mutable_error()->set_code(grpc::StatusCode::INVALID_ARGUMENT);
      answer->mutable_error()->set_message("channel counts differ");
      return answer;
    }
  }
  Moments merged, next;
  ToMoments(first.moments(), &merged);
  for (size_t r = 1; r < by_rank.size(); ++r) {
    ToMoments(by_rank[r].moments(), &next);
    MergeMoments(merged, next);
  }
  const GlobalMoments g = Finalize(std::move(merged));
  v1::GlobalMoments* out = answer->mutable_moments();
  out->set_count(g.count);
  out->mutable_mean()->Add(g.mean.begin(), g.mean.end());
  out->mutable_var()->Add(g.var.begin(), g.var.end());
  return answer;
}

void FloorService::Arrive(FloorReactor* stream, v1::Contribution* in) {
  Pending round;
  {
    absl::MutexLock lock(&mu_);
    const auto job = worlds_.find(in->job_id());
    const int world = job == worlds_.end() ? 1 : job->second;
    Key key(in->job_id(), in->layer(), in->step(), in->phase());
    Pending& p = pending_[key];
    if (p.by_rank.empty()) {
      p.by_rank.resize(world);
      p.streams.resize(world);
    }
    const int rank = (in->rank() % world + world) % world;
    p.by_rank[rank].Swap(in);
    p.streams[rank] = stream;
    if (++p.arrived < world) return;
    round = std::move(p);
    pending_.erase(key);
  }
  const std::shared_ptr<const v1::RoundResult> answer =
      FloorAnswer(round.by_rank);
  for (FloorReactor* s : round.streams) s->Reply(answer);
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As syncnorm's server does (server/main.cc, TuneMalloc): keep freed
  // blocks in the heap instead of returning them to the kernel on every
  // round, whose pages would then fault in again (tens of us per round at
  // C = 2048 here, which would weigh on the references, not on syncnorm).
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  if (absl::GetFlag(FLAGS_floor)) {
    // As syncnorm's server does (server/main.cc): Debian's Abseil records a
    // lock-order graph on every absl::Mutex acquisition, which the floor's
    // W stream mutexes would pay on every contribution.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  syncnorm::bench::EchoService echo;
  syncnorm::bench::StarService star;
  syncnorm::bench::LeanService lean;
  syncnorm::bench::FloorService floor;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  // The transport syncnorm's server and client use (server/server.cc,
  // client/client.cc), so that the references differ from it in design
  // only.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  const int cq_threads = absl::GetFlag(FLAGS_cq_threads);
  syncnorm::bench::Lean::AsyncService async_lean;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (absl::GetFlag(FLAGS_floor)) {
    builder.RegisterService(&floor);
  } else if (cq_threads > 0) {
    builder.RegisterService(&async_lean);
    for (int i = 0; i < cq_threads; ++i)
      cqs.push_back(builder.AddCompletionQueue());
  } else {
    builder.RegisterService(&echo);
    builder.RegisterService(&star);
    builder.RegisterService(&lean);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "bench-server: cannot listen\n");
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::fprintf(stderr, "bench-server listening on port %d\n", port);
  if (cq_threads > 0) {
    syncnorm::bench::AsyncLean::Rounds rounds;
    std::vector<std::unique_ptr<syncnorm::bench::AsyncLean>> queues;
    std::vector<std::thread> threads;
    for (auto& cq : cqs) {
      queues.push_back(std::make_unique<syncnorm::bench::AsyncLean>(
          &async_lean, cq.get(), &rounds));
      queues.back()->Accept();
    }
    for (auto& q : queues) threads.emplace_back([&q] { q->Run(); });
    for (std::thread& t : threads) t.join();  // runs until killed
  }
  server->Wait();
  return 0;
}
