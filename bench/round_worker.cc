// bench-round-worker: one worker process of the round-latency and
// step-overhead benchmarks. Prints one line per channel count (or one for
// the steps) to stdout:
//   LAT <C> <us> <us> ...      latency of each measured round, microseconds
//   STEP <ms> <ms> ...         wall time of each measured ResNet-50 step
// Modes:
//   syncnorm  forward rounds through client/contributor.h against the real
//             aggregator (one layer per channel count)
//   star      the same payload through bench.proto's Star (thread per stream)
//   lean      the same payload through bench.proto's Lean (callback API)
//   pingpong  the same payload echoed over one stream (the floor; W = 1)
//   resnet    53 ResNet-50 forward rounds then 53 backward rounds per step
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench.grpc.pb.h"
#include "bench/resnet50_layers.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "kernels/moments.h"

ABSL_FLAG(std::string, mode, "syncnorm",
          "syncnorm | star | lean | pingpong | resnet");
ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, job, "bench", "job id (syncnorm, resnet)");
ABSL_FLAG(int, rank, 0, "this worker's rank");
ABSL_FLAG(int, world, 2, "workers in the round");
ABSL_FLAG(std::string, channels, "64", "comma-separated channel counts");
ABSL_FLAG(int, rounds, 200, "measured rounds (steps for resnet)");
ABSL_FLAG(int, warmup, 20, "unmeasured rounds first");
ABSL_FLAG(int, batch, 32, "samples per worker (resnet counts)");
ABSL_FLAG(bool, stats_health, true,
          "false: the job turns statistics health off (what it costs)");

namespace syncnorm::bench {
namespace {

double Micros(absl::Time t0) {
  return absl::ToDoubleMicroseconds(absl::Now() - t0);
}

void PrintLine(const std::string& tag, const std::string& key,
               const std::vector<double>& values) {
  std::string line = tag + (key.empty() ? "" : " " + key);
  for (double v : values) absl::StrAppend(&line, " ", absl::SixDigits(v));
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Moments RandomMoments(int channels, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  Moments m;
  m.count = count;
  for (int c = 0; c < channels; ++c) {
    m.mean.push_back(u(rng));
    m.m2.push_back(u(rng) * count);
  }
  return m;
}

GradSums RandomSums(int channels, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  GradSums g;
  for (int c = 0; c < channels; ++c) {
    g.sum_dy.push_back(u(rng));
    g.sum_dy_xmu.push_back(u(rng));
  }
  return g;
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

void Die(const std::string& what) {
  std::fprintf(stderr, "bench-round-worker: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<Client> ConnectAndCreate(
    const std::vector<std::pair<std::string, int>>& layers) {
  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  auto client = std::make_unique<Client>(options);
  v1::CreateJobRequest job;
  job.set_job_id(absl::GetFlag(FLAGS_job));
  job.set_world_size(absl::GetFlag(FLAGS_world));
  job.set_round_timeout_ms(60000);
  job.set_disable_stats_health(!absl::GetFlag(FLAGS_stats_health));
  for (const auto& [name, channels] : layers) {
    v1::LayerSpec* spec = job.add_layers();
    spec->set_name(name);
    spec->set_num_features(channels);
  }
  auto created = client->CreateJob(job);  // idempotent: every rank sends it
  if (!created.ok()) Die(created.status().ToString());
  return client;
}

void RunSyncnorm(const std::vector<int>& channels) {
  std::vector<std::pair<std::string, int>> layers;
  for (int c : channels) layers.emplace_back(absl::StrCat("c", c), c);
  std::unique_ptr<Client> client = ConnectAndCreate(layers);
  const int rank = absl::GetFlag(FLAGS_rank);
  std::unique_ptr<Contributor> contributor =
      client->NewContributor(absl::GetFlag(FLAGS_job), rank);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  for (size_t l = 0; l < channels.size(); ++l) {
    const Moments local = RandomMoments(channels[l], 1024, rank + 1);
    std::vector<double> lat;
    for (int s = 0; s < warmup + rounds; ++s) {
      const absl::Time t0 = absl::Now();
      auto r = contributor->ReduceForward(static_cast<int>(l), s, local);
      if (!r.ok()) Die(r.status().ToString());
      if (s >= warmup) lat.push_back(Micros(t0));
    }
    PrintLine("LAT", absl::StrCat(channels[l]), lat);
  }
}

// What a reference server must answer for channel count `c`: the echo of
// this rank's Blob values, or the merge of every rank's moments (each rank
// draws RandomMoments(c, 1024, rank + 1)) in float64 by the two-pass
// formulas (biased variance), independent of MergeMoments.
std::vector<double> ExpectedAnswer(const std::string& mode, int c, int rank,
                                   int world) {
  std::vector<Moments> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(
        RandomMoments(c, 1024, (mode == "pingpong" ? rank : r) + 1));
  }
  if (mode == "pingpong") {
    std::vector<double> v = ranks[0].mean;
    v.insert(v.end(), ranks[0].m2.begin(), ranks[0].m2.end());
    return v;
  }
  std::vector<double> mean(c), var(c);
  for (int i = 0; i < c; ++i) {
    double n = 0, sum = 0;
    for (const Moments& m : ranks) {
      n += static_cast<double>(m.count);
      sum += static_cast<double>(m.count) * m.mean[i];
    }
    mean[i] = sum / n;
    double ss = 0;
    for (const Moments& m : ranks) {
      const double d = m.mean[i] - mean[i];
      ss += m.m2[i] + static_cast<double>(m.count) * d * d;
    }
    var[i] = ss / n;
  }
  mean.insert(mean.end(), var.begin(), var.end());
  return mean;
}

// Dies unless `in` holds `want` (to 1e-12 relative).
void CheckAnswer(const Blob& in, const std::vector<double>& want) {
  if (in.values_size() != static_cast<int>(want.size())) Die("short answer");
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = in.values(static_cast<int>(i));
    if (!(std::abs(got - want[i]) <=
          1e-12 * std::max(1.0, std::abs(want[i])))) {
      Die(absl::StrCat("wrong answer: value ", i, " is ", got, ", want ",
                       want[i]));
    }
  }
}

// star, lean and pingpong: the same Blob loop over a bench.proto stream.
void RunBlobs(const std::vector<int>& channels, const std::string& mode) {
  // The transport syncnorm's client uses (client/client.cc).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  auto channel = grpc::CreateCustomChannel(
      absl::GetFlag(FLAGS_address), grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<Blob, Blob>> stream;
  if (mode == "star") {
    stream = Star::NewStub(channel)->Round(&context);
  } else if (mode == "lean") {
    stream = Lean::NewStub(channel)->Round(&context);
  } else {
    stream = Echo::NewStub(channel)->PingPong(&context);
  }
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = mode == "pingpong" ? 1 : absl::GetFlag(FLAGS_world);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  int64_t round_id = 0;
  for (int c : channels) {
    const Moments local = RandomMoments(c, 1024, rank + 1);
    const std::vector<double> want = ExpectedAnswer(mode, c, rank, world);
    std::vector<double> lat;
    for (int s = 0; s < warmup + rounds; ++s) {
      const absl::Time t0 = absl::Now();
      // Built inside the timed region, as the client builds its proto.
      Blob out;
      out.set_round(round_id++);
      out.set_rank(rank);
      out.set_world(world);
      out.set_count(local.count);
      for (double v : local.mean) out.add_values(v);
      for (double v : local.m2) out.add_values(v);
      Blob in;
      if (!stream->Write(out) || !stream->Read(&in)) Die("stream broke");
      if (s >= warmup) lat.push_back(Micros(t0));
      // Outside the timed region: the first and last rounds of each C.
      if (s == 0 || s + 1 == warmup + rounds) CheckAnswer(in, want);
    }
    PrintLine("LAT", absl::StrCat(c), lat);
  }
  stream->WritesDone();
  grpc::Status st = stream->Finish();
  if (!st.ok()) Die(st.error_message());
}

void RunResnet() {
  const std::vector<BnLayer> bn = ResNet50BnLayers();
  std::vector<std::pair<std::string, int>> layers;
  for (const BnLayer& l : bn) layers.emplace_back(l.name, l.channels);
  std::unique_ptr<Client> client = ConnectAndCreate(layers);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int batch = absl::GetFlag(FLAGS_batch);
  std::unique_ptr<Contributor> contributor =
      client->NewContributor(absl::GetFlag(FLAGS_job), rank);
  std::vector<Moments> moments;
  std::vector<GradSums> sums;
  for (const BnLayer& l : bn) {
    moments.push_back(RandomMoments(
        l.channels, static_cast<int64_t>(batch) * l.spatial * l.spatial,
        rank + 1));
    sums.push_back(RandomSums(l.channels, rank + 7));
  }
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_rounds);
  std::vector<double> ms;
  for (int s = 0; s < warmup + steps; ++s) {
    const absl::Time t0 = absl::Now();
    for (int l = 0; l < static_cast<int>(bn.size()); ++l) {
      auto r = contributor->ReduceForward(l, s, moments[l]);
      if (!r.ok()) Die(r.status().ToString());
    }
    for (int l = static_cast<int>(bn.size()) - 1; l >= 0; --l) {
      auto r = contributor->ReduceBackward(l, s, /*backward=*/0, sums[l]);
      if (!r.ok()) Die(r.status().ToString());
    }
    if (s >= warmup) ms.push_back(Micros(t0) / 1000.0);
  }
  PrintLine("STEP", "", ms);
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace syncnorm::bench;  // NOLINT
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const std::vector<int> channels = ParseInts(absl::GetFlag(FLAGS_channels));
  if (mode == "syncnorm") {
    RunSyncnorm(channels);
  } else if (mode == "star" || mode == "lean" || mode == "pingpong") {
    RunBlobs(channels, mode);
  } else if (mode == "resnet") {
    RunResnet();
  } else {
    Die("unknown --mode " + mode);
  }
  return 0;
}
