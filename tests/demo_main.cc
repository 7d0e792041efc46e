// The syncnorm demo: starts an aggregator, runs W worker processes that each
// own an uneven shard of a synthetic batch through a ResNet-stage-shaped
// stack of SyncBatchNorm layers (forward and backward, N steps), then checks
// every worker's outputs, input gradients and running statistics against one
// float64 computation of plain batch norm over the concatenated batch.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "tests/testing/cluster.h"
#include "tests/testing/compare.h"
#include "tests/testing/reference.h"

ABSL_FLAG(int, workers, 4, "worker processes (W)");
ABSL_FLAG(int, steps, 20, "training steps (N)");
ABSL_FLAG(int, batch, 32, "global batch per step, split unevenly over W");
ABSL_FLAG(std::string, channels, "64,64,256,64,64,256",
          "channels of each BN layer (a ResNet bottleneck stage)");
ABSL_FLAG(std::string, spatial, "8,8", "spatial size of the activations");
ABSL_FLAG(double, max_error, 1e-6, "worst relative error allowed");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "demo failed: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace syncnorm::testing;  // NOLINT: a short main
  StackConfig config;
  config.world_size = absl::GetFlag(FLAGS_workers);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.global_batch = absl::GetFlag(FLAGS_batch);
  config.channels.clear();
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_channels), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(c, &v)) config.channels.push_back(v);
  }
  config.spatial.clear();
  for (absl::string_view d :
       absl::StrSplit(absl::GetFlag(FLAGS_spatial), ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(d, &v)) config.spatial.push_back(v);
  }

  const std::string dir = MakeScratchDir("syncnorm-demo");
  auto aggregator = AggregatorProcess::Start(dir);
  if (!aggregator.ok()) return Fail(aggregator.status());
  std::fprintf(stderr,
               "aggregator on %s; %d workers, %zu BN layers, global batch %d, "
               "%d steps\n",
               (*aggregator)->address().c_str(), config.world_size,
               config.channels.size(), config.global_batch, config.steps);

  syncnorm::ClientOptions client_options;
  client_options.address = (*aggregator)->address();
  syncnorm::Client client(client_options);
  auto job = client.CreateJob(JobRequest(config, "demo", 10000));
  if (!job.ok()) return Fail(job.status());

  WorkersOptions workers;
  workers.address = (*aggregator)->address();
  workers.job_id = "demo";
  workers.dir = dir;
  workers.progress = true;
  auto outputs = RunWorkers(config, workers);
  if (!outputs.ok()) return Fail(outputs.status());

  std::fprintf(stderr,
               "computing the float64 reference on the concatenated "
               "batch...\n");
  const ReferenceResult reference = RunReference(config);
  const Comparison cmp = Compare(config, reference, *outputs);
  auto stopped = (*aggregator)->Stop();
  std::printf("worst relative error: %.3g (%s) over %d ranks\n", cmp.worst,
              cmp.worst_what.c_str(), cmp.ranks_seen);
  if (!stopped.ok() || *stopped != 0) {
    std::printf("the aggregator did not stop cleanly\n");
    return 1;
  }
  if (!(cmp.worst <= absl::GetFlag(FLAGS_max_error))) {
    std::printf("FAIL: above %.3g\n", absl::GetFlag(FLAGS_max_error));
    return 1;
  }
  std::printf("OK: at most %.3g\n", absl::GetFlag(FLAGS_max_error));
  return 0;
}
