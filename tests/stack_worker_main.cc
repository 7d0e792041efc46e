// A worker process of the stack model (see tests/testing/stack_model.h):
// trains its shards through SyncBatchNorm layers against a running
// aggregator and writes its last-step outputs for the checker.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "tests/testing/stack_worker.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "aggregator address, or its shards: host:port,host:port,...");
ABSL_FLAG(std::string, job, "", "job id (created beforehand)");
ABSL_FLAG(int, rank, 0, "this process's contributor rank");
ABSL_FLAG(int, local_size, 1, "data ranks per process, as threads of a node");
ABSL_FLAG(std::string, out, "", "file for the outputs");
ABSL_FLAG(bool, progress, false, "print a line per step");
ABSL_FLAG(int, round_timeout_ms, 60000, "client-side bound of one round");
ABSL_FLAG(int, world_size, 4, "data ranks in all");
ABSL_FLAG(int, group_size, 0, "ranks per group; 0: one group");
ABSL_FLAG(int, global_batch, 32, "samples per step over all ranks");
ABSL_FLAG(std::string, channels, "16,16,32", "channels of each layer");
ABSL_FLAG(std::string, spatial, "6,6", "spatial dimensions");
ABSL_FLAG(bool, channels_last, false, "channels-last layout");
ABSL_FLAG(bool, fuse_relu, true, "ReLU after each BN");
ABSL_FLAG(int, steps, 5, "training steps");
ABSL_FLAG(uint64_t, seed, 1, "data seed");
ABSL_FLAG(int, momentum_mode, 1, "1 torch, 2 decay, 3 cumulative");
ABSL_FLAG(double, momentum, 0.1, "momentum");
ABSL_FLAG(bool, biased_running_var, false, "biased running var");
ABSL_FLAG(double, eps, 1e-5, "eps");

namespace {

template <typename T>
std::vector<T> ParseList(const std::string& s) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(static_cast<T>(v));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  syncnorm::testing::StackConfig config;
  config.world_size = absl::GetFlag(FLAGS_world_size);
  config.group_size = absl::GetFlag(FLAGS_group_size);
  config.global_batch = absl::GetFlag(FLAGS_global_batch);
  config.channels = ParseList<int>(absl::GetFlag(FLAGS_channels));
  config.spatial = ParseList<int64_t>(absl::GetFlag(FLAGS_spatial));
  config.channels_last = absl::GetFlag(FLAGS_channels_last);
  config.fuse_relu = absl::GetFlag(FLAGS_fuse_relu);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.seed = absl::GetFlag(FLAGS_seed);
  config.mode =
      static_cast<syncnorm::MomentumMode>(absl::GetFlag(FLAGS_momentum_mode));
  config.momentum = absl::GetFlag(FLAGS_momentum);
  config.biased_running_var = absl::GetFlag(FLAGS_biased_running_var);
  config.eps = absl::GetFlag(FLAGS_eps);

  syncnorm::ClientOptions client_options;
  client_options.address = absl::GetFlag(FLAGS_server);
  client_options.round_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_round_timeout_ms));
  syncnorm::Client client(client_options);

  syncnorm::testing::WorkerOptions options;
  options.job_id = absl::GetFlag(FLAGS_job);
  options.process_rank = absl::GetFlag(FLAGS_rank);
  options.local_size = absl::GetFlag(FLAGS_local_size);
  options.progress = absl::GetFlag(FLAGS_progress);
  auto outputs = syncnorm::testing::RunWorker(client, config, options);
  if (!outputs.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", options.process_rank,
                 outputs.status().ToString().c_str());
    return 1;
  }
  absl::Status s =
      syncnorm::testing::WriteOutputs(absl::GetFlag(FLAGS_out), *outputs);
  if (!s.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", options.process_rank,
                 s.ToString().c_str());
    return 1;
  }
  return 0;
}
