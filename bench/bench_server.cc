// bench-server: the reference services of the round-latency and throughput
// benchmarks (see bench.proto). Echo uses gRPC's callback API, Star the
// synchronous API with a thread per stream, as a naive aggregator would.
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/moments.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, port_file, "", "the bound port is written here");

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
      Moments merged = r.by_rank[0];
      for (int i = 1; i < world; ++i) MergeMoments(merged, r.by_rank[i]);
      const GlobalMoments g = Finalize(merged);
      r.answer.set_round(in.round());
      r.answer.set_count(g.count);
      for (double v : g.mean) r.answer.add_values(v);
      for (double v : g.var) r.answer.add_values(v);
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

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  syncnorm::bench::EchoService echo;
  syncnorm::bench::StarService star;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&echo);
  builder.RegisterService(&star);
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
  server->Wait();
  return 0;
}
