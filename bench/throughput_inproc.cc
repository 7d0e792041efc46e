// bench-throughput-inproc: contributions merged per second by the
// Aggregator itself (no gRPC), many jobs and layers, one driver thread per
// core, against the bare Chan merge of the same contributions (the floor of
// the arithmetic). Prints
//   INPROC <contributions per second>
//   MERGE <contributions per second>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/clock.h"
#include "server/domain/contribution.h"
#include "server/domain/job_spec.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

ABSL_FLAG(int, jobs, 8, "concurrent jobs");
ABSL_FLAG(int, world, 4, "ranks per job");
ABSL_FLAG(int, layers, 16, "layers per job");
ABSL_FLAG(int, channels, 256, "channels per layer");
ABSL_FLAG(int, threads, 2, "driver threads");
ABSL_FLAG(double, seconds, 2.0, "seconds per measurement");

namespace syncnorm::bench {
namespace {

Moments RankPayload(int channels, int rank) {
  Moments m;
  m.count = 1024;
  for (int i = 0; i < channels; ++i) {
    m.mean.push_back(0.5 + 1e-3 * (i + rank));
    m.m2.push_back(1000.0 + i);
  }
  return m;
}

// Runs `body(thread, stop)` on every driver thread for the configured time
// and returns the contributions they report per second.
template <typename Body>
double Measure(Body body) {
  const int threads = absl::GetFlag(FLAGS_threads);
  std::atomic<bool> stop{false};
  std::vector<int64_t> counts(threads, 0);
  std::vector<std::thread> pool;
  const absl::Time t0 = absl::Now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { counts[t] = body(t, stop); });
  }
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  stop = true;
  for (auto& th : pool) th.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total / secs;
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace syncnorm;         // NOLINT
  using namespace syncnorm::bench;  // NOLINT
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int world = absl::GetFlag(FLAGS_world);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int channels = absl::GetFlag(FLAGS_channels);
  const int threads = absl::GetFlag(FLAGS_threads);
  std::vector<Moments> payloads;
  for (int r = 0; r < world; ++r) payloads.push_back(RankPayload(channels, r));

  RealClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator aggregator(AggregatorOptions{}, &clock, &store);
  aggregator.StartReaper();
  for (int j = 0; j < jobs; ++j) {
    JobSpec spec;
    spec.job_id = absl::StrCat("inproc-", j);
    spec.world_size = world;
    for (int l = 0; l < layers; ++l) {
      LayerConfig layer;
      layer.channels = channels;
      spec.layers.push_back(layer);
    }
    auto created = aggregator.CreateJob(spec);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 1;
    }
  }

  std::atomic<int64_t> failed{0};
  const double inproc = Measure([&](int t, std::atomic<bool>& stop) {
    int64_t answered = 0;
    for (int64_t step = 0; !stop; ++step) {
      for (int j = t; j < jobs; j += threads) {
        for (int l = 0; l < layers; ++l) {
          for (int r = 0; r < world; ++r) {
            Contribution c;
            c.job_id = absl::StrCat("inproc-", j);
            c.layer = l;
            c.step = step;
            c.phase = Phase::kForward;
            c.rank = r;
            c.payload = payloads[r];
            aggregator.Contribute(std::move(c), [&](const RoundOutcome& o) {
              if (o.status.ok()) {
                ++answered;
              } else {
                failed.fetch_add(1);
              }
            });
          }
        }
      }
    }
    return answered;
  });
  if (failed.load() > 0) {
    std::fprintf(stderr, "%lld contributions failed\n",
                 static_cast<long long>(failed.load()));
    return 1;
  }
  const double merge = Measure([&](int, std::atomic<bool>& stop) {
    int64_t merged = 0;
    double sink = 0;
    while (!stop) {
      Moments acc = payloads[0];
      for (int r = 1; r < world; ++r) MergeMoments(acc, payloads[r]);
      sink += Finalize(acc).mean[0];
      merged += world;
    }
    return merged + (sink < 0 ? 1 : 0);
  });
  std::printf("INPROC %.1f\nMERGE %.1f\n", inproc, merge);
  return 0;
}
