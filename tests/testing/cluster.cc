#include "tests/testing/cluster.h"

#include <signal.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/layer_spec.h"
#include "client/sync_batch_norm_options.h"

namespace syncnorm::testing {
absl::StatusOr<std::unique_ptr<AggregatorProcess>> AggregatorProcess::Start(
    const std::string& dir, const std::vector<std::string>& flags) {
  const std::string port_file = absl::StrCat(dir, "/aggregator.port");
  std::remove(port_file.c_str());
  std::vector<std::string> argv = {Runfile("server/syncnorm-aggregator"),
                                   "--listen=127.0.0.1:0",
                                   absl::StrCat("--port_file=", port_file),
                                   absl::StrCat("--data_dir=", dir, "/data")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto process = Subprocess::Spawn(argv, absl::StrCat(dir, "/aggregator.log"));
  if (!process.ok()) return process.status();
  auto self = std::unique_ptr<AggregatorProcess>(new AggregatorProcess);
  self->process_ = std::move(*process);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    if (in >> self->port_ && self->port_ > 0) return self;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the aggregator did not report its port within 30 s; its log:\n",
      ReadFile(absl::StrCat(dir, "/aggregator.log"))));
}

std::string AggregatorProcess::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

absl::StatusOr<int> AggregatorProcess::Stop() {
  process_->Signal(SIGTERM);
  return process_->Wait(absl::Seconds(30));
}

v1::CreateJobRequest JobRequest(const StackConfig& config,
                                const std::string& job_id,
                                int64_t round_timeout_ms, int local_size) {
  v1::CreateJobRequest request;
  request.set_job_id(job_id);
  request.set_world_size(config.world_size / local_size);
  request.set_group_size(local_size == 1 ? config.group_size : 0);
  request.set_round_timeout_ms(round_timeout_ms);
  for (int l = 0; l < config.layers(); ++l) {
    SyncBatchNormOptions o;
    o.num_features = config.channels[l];
    o.momentum_mode = config.mode;
    o.momentum = config.momentum;
    o.biased_running_var = config.biased_running_var;
    *request.add_layers() = *ToLayerSpec(o, absl::StrCat("layer", l));
  }
  return request;
}

absl::StatusOr<std::vector<RankOutput>> RunWorkers(const StackConfig& config,
                                                   const WorkersOptions& opts) {
  const int processes = config.world_size / opts.local_size;
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int p = 0; p < processes; ++p) {
    std::vector<std::string> argv = {
        Runfile("tests/stack-worker"),
        absl::StrCat("--server=", opts.address),
        absl::StrCat("--job=", opts.job_id),
        absl::StrCat("--rank=", p),
        absl::StrCat("--local_size=", opts.local_size),
        absl::StrCat("--out=", opts.dir, "/worker", p, ".out"),
        absl::StrCat("--progress=", opts.progress && p == 0 ? "true" : "false"),
    };
    for (const std::string& f : ToFlags(config)) argv.push_back(f);
    const std::string log = absl::StrCat(opts.dir, "/worker", p, ".log");
    auto w = Subprocess::Spawn(argv, opts.progress && p == 0 ? "" : log);
    if (!w.ok()) return w.status();
    workers.push_back(std::move(*w));
  }
  std::vector<RankOutput> all;
  for (int p = 0; p < processes; ++p) {
    absl::StatusOr<int> code = workers[p]->Wait(opts.timeout);
    const std::string log = absl::StrCat(opts.dir, "/worker", p, ".log");
    if (!code.ok() || *code != 0) {
      return absl::InternalError(absl::StrCat(
          "worker ", p, " failed (",
          code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString(),
          "); its log:\n", ReadFile(log)));
    }
    auto outputs = ReadOutputs(absl::StrCat(opts.dir, "/worker", p, ".out"));
    if (!outputs.ok()) return outputs.status();
    all.insert(all.end(), outputs->begin(), outputs->end());
  }
  return all;
}

}  // namespace syncnorm::testing
