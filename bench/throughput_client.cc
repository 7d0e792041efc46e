// bench-throughput-client: saturates a server with many concurrent streams
// and counts answers per second. Prints
//   WINDOW_BEGIN                          (when counting starts)
//   THROUGHPUT <answers> <errors> <seconds>
// Modes:
//   syncnorm  J jobs x W ranks Reduce streams against the aggregator; each
//             stream walks (step, layer) over L layers of C channels with up
//             to `window` contributions in flight (different layers).
//   echo      the same streams, window and payload against bench Echo: the
//             transport ceiling of this machine.
//   lean      the same streams, window and payload against bench Lean (a
//             job's W streams make its rounds): the least aggregator.
// Uses gRPC's callback API so one process drives every stream.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

ABSL_FLAG(std::string, mode, "syncnorm", "syncnorm | echo | lean");
ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server address");
ABSL_FLAG(int, jobs, 8, "concurrent jobs");
ABSL_FLAG(int, world, 4, "ranks (streams) per job");
ABSL_FLAG(int, layers, 16, "layers per job");
ABSL_FLAG(int, channels, 256, "channels per layer");
ABSL_FLAG(int, window, 8, "contributions in flight per stream (<= layers)");
ABSL_FLAG(double, warmup_s, 1.0, "seconds before counting");
ABSL_FLAG(double, seconds, 3.0, "seconds counted");

namespace syncnorm::bench {
namespace {

std::atomic<int64_t> g_ok{0};
std::atomic<int64_t> g_err{0};

// One stream that keeps `window` requests in flight until the process ends.
template <typename Req, typename Resp>
class LoadStream : public grpc::ClientBidiReactor<Req, Resp> {
 public:
  using MakeFn = std::function<void(int64_t seq, Req*)>;
  using OkFn = std::function<bool(const Resp&)>;
  LoadStream(MakeFn make, OkFn ok, int window)
      : make_(std::move(make)), ok_(std::move(ok)), window_(window) {}

  void Begin() {
    this->StartRead(&resp_);
    this->StartCall();
    MaybeWrite();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    MaybeWrite();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    (ok_(resp_) ? g_ok : g_err).fetch_add(1, std::memory_order_relaxed);
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
    }
    this->StartRead(&resp_);
    MaybeWrite();
  }
  void OnDone(const grpc::Status& s) override {
    if (!s.ok())
      std::fprintf(stderr, "stream: %s\n", s.error_message().c_str());
  }

 private:
  void MaybeWrite() {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || broken_) return;
      if (in_flight_ < window_) {
        req_.Clear();
        make_(seq_++, &req_);
        ++in_flight_;
        write = writing_ = true;
      }
    }
    if (write) this->StartWrite(&req_);
  }

  const MakeFn make_;
  const OkFn ok_;
  const int window_;
  Req req_;
  Resp resp_;
  absl::Mutex mu_;
  int64_t seq_ = 0;
  int in_flight_ = 0;
  bool writing_ = false, broken_ = false;
};

struct Streams {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::function<void()>> begin;
};

std::shared_ptr<grpc::Channel> NewChannel(int index) {
  grpc::ChannelArguments args;
  args.SetInt("syncnorm.bench.channel", index);  // one connection per job
  return grpc::CreateCustomChannel(absl::GetFlag(FLAGS_address),
                                   grpc::InsecureChannelCredentials(), args);
}

template <typename Req, typename Resp, typename Starter>
void AddStream(Streams& s, Starter start,
               typename LoadStream<Req, Resp>::MakeFn make,
               typename LoadStream<Req, Resp>::OkFn ok) {
  auto stream = std::make_shared<LoadStream<Req, Resp>>(
      std::move(make), std::move(ok), absl::GetFlag(FLAGS_window));
  s.contexts.push_back(std::make_unique<grpc::ClientContext>());
  start(s.contexts.back().get(), stream.get());
  s.begin.push_back([stream] { stream->Begin(); });
}

void CreateJobs(const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  for (int j = 0; j < absl::GetFlag(FLAGS_jobs); ++j) {
    auto stub = v1::Aggregator::NewStub(channels[j]);
    v1::CreateJobRequest req;
    req.set_job_id(absl::StrCat("tput-", j));
    req.set_world_size(absl::GetFlag(FLAGS_world));
    req.set_round_timeout_ms(60000);
    for (int l = 0; l < absl::GetFlag(FLAGS_layers); ++l) {
      req.add_layers()->set_num_features(absl::GetFlag(FLAGS_channels));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ctx.set_wait_for_ready(true);
    v1::JobInfo info;
    grpc::Status st = stub->CreateJob(&ctx, req, &info);
    if (!st.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", st.error_message().c_str());
      std::exit(1);
    }
  }
}

void BuildStreams(Streams& s, const std::string& mode) {
  const bool syncnorm = mode == "syncnorm";
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int world = absl::GetFlag(FLAGS_world);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int c = absl::GetFlag(FLAGS_channels);
  for (int j = 0; j < jobs; ++j) s.channels.push_back(NewChannel(j));
  if (syncnorm) CreateJobs(s.channels);
  for (int j = 0; j < jobs; ++j) {
    for (int r = 0; r < world; ++r) {
      if (syncnorm) {
        auto stub = std::shared_ptr<v1::Aggregator::Stub>(
            v1::Aggregator::NewStub(s.channels[j]));
        const std::string job = absl::StrCat("tput-", j);
        AddStream<v1::Contribution, v1::RoundResult>(
            s,
            [stub](grpc::ClientContext* ctx, auto* reactor) {
              stub->async()->Reduce(ctx, reactor);
            },
            [job, r, layers, c](int64_t seq, v1::Contribution* m) {
              m->set_job_id(job);
              m->set_layer(static_cast<int>(seq % layers));
              m->set_step(seq / layers);
              m->set_phase(v1::FORWARD);
              m->set_rank(r);
              v1::Moments* mo = m->mutable_moments();
              mo->set_count(1024);
              for (int i = 0; i < c; ++i) mo->add_mean(0.5 + 1e-3 * (i + r));
              for (int i = 0; i < c; ++i) mo->add_m2(1000.0 + i);
            },
            [](const v1::RoundResult& res) {
              if (res.has_moments()) return true;
              static std::atomic<int> shown{0};
              if (shown.fetch_add(1) < 5) {
                std::fprintf(stderr, "round (layer %d, step %lld): %s\n",
                             res.layer(), static_cast<long long>(res.step()),
                             res.error().message().c_str());
              }
              return false;
            });
      } else if (mode == "lean") {
        auto stub = std::shared_ptr<Lean::Stub>(Lean::NewStub(s.channels[j]));
        AddStream<Blob, Blob>(
            s,
            [stub](grpc::ClientContext* ctx, auto* reactor) {
              stub->async()->Round(ctx, reactor);
            },
            [j, r, world, c](int64_t seq, Blob* b) {
              // The job's rounds, the same sequence on each of its ranks.
              b->set_round((int64_t{j} << 40) + seq);
              b->set_rank(r);
              b->set_world(world);
              b->set_count(1024);
              for (int i = 0; i < c; ++i) b->add_values(0.5 + 1e-3 * (i + r));
              for (int i = 0; i < c; ++i) b->add_values(1000.0 + i);
            },
            [c](const Blob& b) { return b.values_size() == 2 * c; });
      } else {
        auto stub = std::shared_ptr<Echo::Stub>(Echo::NewStub(s.channels[j]));
        AddStream<Blob, Blob>(
            s,
            [stub](grpc::ClientContext* ctx, auto* reactor) {
              stub->async()->PingPong(ctx, reactor);
            },
            [r, c](int64_t seq, Blob* b) {
              b->set_round(seq);
              b->set_rank(r);
              b->set_count(1024);
              for (int i = 0; i < 2 * c; ++i) b->add_values(0.5 + 1e-3 * i);
            },
            [c](const Blob& b) { return b.values_size() == 2 * c; });
      }
    }
  }
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace syncnorm::bench;  // NOLINT
  Streams streams;
  BuildStreams(streams, absl::GetFlag(FLAGS_mode));
  for (auto& f : streams.begin) f();
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_warmup_s)));
  std::printf("WINDOW_BEGIN\n");
  std::fflush(stdout);
  const int64_t ok0 = g_ok.load(), err0 = g_err.load();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  const int64_t ok1 = g_ok.load(), err1 = g_err.load();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  std::printf("THROUGHPUT %lld %lld %.6f\n", static_cast<long long>(ok1 - ok0),
              static_cast<long long>(err1 - err0), secs);
  std::fflush(stdout);
  // Rounds other ranks left half-full never finish, so the streams cannot
  // drain; the process ends without tearing them down.
  std::_Exit(0);
}
