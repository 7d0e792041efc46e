#include "tests/testing/stack_worker.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/node_group.h"
#include "client/sync_batch_norm.h"
#include "client/thread_node.h"
#include "kernels/thread_pool.h"

namespace syncnorm::testing {
namespace {

struct Timing {
  absl::Duration step, forward_sync, backward_sync;
};

// One data rank's layers and the loop over steps.
class RankRunner {
 public:
  RankRunner(const StackConfig& config, int rank, NodeGroup* group,
             ThreadPool* pool)
      : config_(config), rank_(rank) {
    for (int l = 0; l < config.layers(); ++l) {
      SyncBatchNormOptions o;
      o.num_features = config.channels[l];
      o.eps = config.eps;
      o.momentum_mode = config.mode;
      o.momentum = config.momentum;
      o.biased_running_var = config.biased_running_var;
      o.channels_last = config.channels_last;
      o.fuse_relu = config.fuse_relu;
      layers_.push_back(std::make_unique<SyncBatchNorm>(l, o, group, pool));
      for (int c = 0; c < config.channels[l]; ++c) {
        layers_.back()->weight()[c] = Gamma(config, l, c);
        layers_.back()->bias()[c] = Beta(config, l, c);
      }
    }
  }

  absl::StatusOr<Timing> Step(int64_t step, RankOutput* last);
  const std::vector<std::unique_ptr<SyncBatchNorm>>& layers() const {
    return layers_;
  }

 private:
  TensorRef Ref(std::vector<float>& v, int64_t n, int channels) const {
    return TensorRef{v.data(), Shape(config_, n, channels)};
  }

  const StackConfig& config_;
  const int rank_;
  std::vector<std::unique_ptr<SyncBatchNorm>> layers_;
};

absl::StatusOr<Timing> RankRunner::Step(int64_t step, RankOutput* last) {
  const absl::Time start = absl::Now();
  const int L = config_.layers();
  const int64_t n = ShardSizes(config_, step)[rank_];
  const int64_t base = ShardOffset(config_, step, rank_);
  const int64_t p = config_.positions();
  std::vector<std::vector<float>> x(L), y(L);
  x[0].resize(n * config_.channels[0] * p);
  for (int64_t s = 0; s < n; ++s)
    for (int c = 0; c < config_.channels[0]; ++c)
      for (int64_t q = 0; q < p; ++q)
        x[0][Index(config_, config_.channels[0], s, c, q)] =
            InputValue(config_, step, base + s, c, q);
  Timing t;
  for (int l = 0; l < L; ++l) {
    const int C = config_.channels[l];
    y[l].resize(x[l].size());
    absl::Status s = layers_[l]->Forward(Ref(x[l], n, C), Ref(y[l], n, C));
    if (!s.ok()) return s;
    t.forward_sync += layers_[l]->last_forward_sync();
    if (l + 1 < L) x[l + 1] = MixForward(config_, l, n, y[l]);
  }
  std::vector<float> dy(y[L - 1].size());
  for (int64_t s = 0; s < n; ++s)
    for (int c = 0; c < config_.channels[L - 1]; ++c)
      for (int64_t q = 0; q < p; ++q)
        dy[Index(config_, config_.channels[L - 1], s, c, q)] =
            LossGrad(config_, step, base + s, c, q);
  std::vector<std::vector<float>> dx(L);
  for (int l = L - 1; l >= 0; --l) {
    const int C = config_.channels[l];
    dx[l].resize(dy.size());
    absl::Status s = layers_[l]->Backward(Ref(dy, n, C), Ref(dx[l], n, C));
    if (!s.ok()) return s;
    t.backward_sync += layers_[l]->last_backward_sync();
    if (l > 0) dy = MixBackward(config_, l - 1, n, dx[l]);
  }
  if (last != nullptr) {
    last->rank = rank_;
    for (int l = 0; l < L; ++l) {
      last->y.emplace_back(y[l].begin(), y[l].end());
      last->dx.emplace_back(dx[l].begin(), dx[l].end());
    }
  }
  t.step = absl::Now() - start;
  return t;
}

// The aggregator's running statistics of every layer must equal the mirror
// a worker keeps, bit for bit: both apply the same rule to the same numbers.
absl::Status CheckAgainstServer(Client& client, const StackConfig& config,
                                const std::string& job_id, int group,
                                const RankRunner& runner) {
  v1::GetRunningStatsRequest request;
  request.set_job_id(job_id);
  request.set_group(group);
  absl::StatusOr<v1::RunningStats> stats = client.GetRunningStats(request);
  if (!stats.ok()) return stats.status();
  if (stats->layers_size() != config.layers()) {
    return absl::InternalError("the server returned the wrong layer count");
  }
  for (int l = 0; l < config.layers(); ++l) {
    const v1::LayerStats& server = stats->layers(l);
    const RunningStats& local = runner.layers()[l]->running_stats();
    bool same = server.num_batches_tracked() == local.num_batches_tracked &&
                server.running_mean_size() == local.mean.size();
    for (size_t c = 0; same && c < local.mean.size(); ++c) {
      same = server.running_mean(c) == local.mean[c] &&
             server.running_var(c) == local.var[c];
    }
    if (!same) {
      return absl::InternalError(
          absl::StrCat("layer ", l,
                       ": the aggregator's running statistics differ from the "
                       "worker's mirror"));
    }
  }
  return absl::OkStatus();
}

void PrintProgress(int64_t step, int steps, const Timing& t, int layers) {
  std::fprintf(stderr,
               "step %4lld/%d | step %7.2f ms | sync %6.2f ms fwd + %6.2f ms "
               "bwd over %d layers\n",
               static_cast<long long>(step + 1), steps,
               absl::ToDoubleMilliseconds(t.step),
               absl::ToDoubleMilliseconds(t.forward_sync),
               absl::ToDoubleMilliseconds(t.backward_sync), layers);
}

}  // namespace

absl::StatusOr<std::vector<RankOutput>> RunWorker(
    Client& client, const StackConfig& config, const WorkerOptions& options) {
  const int local = options.local_size;
  // One aggregator or several shards: the client routes each layer.
  std::unique_ptr<NodeGroup> solo =
      client.NewNodeGroup(options.job_id, options.process_rank);
  std::unique_ptr<ThreadNode> node;
  std::vector<std::unique_ptr<NodeGroup>> members;
  if (local == 1) {
    members.push_back(std::move(solo));
  } else {
    node = std::make_unique<ThreadNode>(local, std::move(solo),
                                        client.options().round_timeout);
    for (int i = 0; i < local; ++i) members.push_back(node->Member(i));
  }
  ThreadPool pool(local == 1 ? 2 : 1);
  std::vector<std::unique_ptr<RankRunner>> runners;
  for (int i = 0; i < local; ++i) {
    runners.push_back(std::make_unique<RankRunner>(
        config, options.process_rank * local + i, members[i].get(), &pool));
  }
  std::vector<RankOutput> outputs(local);
  std::vector<absl::Status> status(local);
  auto run = [&](int i) {
    for (int64_t step = 0; step < config.steps; ++step) {
      const bool last = step == config.steps - 1;
      absl::StatusOr<Timing> t =
          runners[i]->Step(step, last ? &outputs[i] : nullptr);
      if (!t.ok()) {
        status[i] = t.status();
        return;
      }
      if (options.progress && i == 0) {
        PrintProgress(step, config.steps, *t, config.layers());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < local; ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  for (int i = 0; i < local; ++i) {
    if (!status[i].ok()) return status[i];
    for (const auto& layer : runners[i]->layers()) {
      outputs[i].running.push_back(layer->running_stats());
    }
  }
  // With threads the job has one group (see WorkerOptions::local_size).
  const int group = local == 1 ? config.group_of(options.process_rank) : 0;
  absl::Status s =
      CheckAgainstServer(client, config, options.job_id, group, *runners[0]);
  if (!s.ok()) return s;
  return outputs;
}

namespace {

void PutVector(std::ofstream& out, const std::vector<double>& v) {
  const uint64_t n = v.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out.write(reinterpret_cast<const char*>(v.data()), n * sizeof(double));
}

bool GetVector(std::ifstream& in, std::vector<double>& v) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), sizeof(n)) || n > (1ULL << 32)) {
    return false;
  }
  v.resize(n);
  return static_cast<bool>(
      in.read(reinterpret_cast<char*>(v.data()), n * sizeof(double)));
}

}  // namespace

absl::Status WriteOutputs(const std::string& path,
                          const std::vector<RankOutput>& outputs) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const RankOutput& o : outputs) {
    PutVector(out,
              {static_cast<double>(o.rank), static_cast<double>(o.y.size())});
    for (size_t l = 0; l < o.y.size(); ++l) {
      PutVector(out, o.y[l]);
      PutVector(out, o.dx[l]);
      PutVector(out, {static_cast<double>(o.running[l].num_batches_tracked)});
      PutVector(out, o.running[l].mean);
      PutVector(out, o.running[l].var);
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankOutput>> ReadOutputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<RankOutput> outputs;
  std::vector<double> header;
  while (GetVector(in, header)) {
    if (header.size() != 2) return absl::DataLossError("bad output header");
    RankOutput o;
    o.rank = static_cast<int>(header[0]);
    const int layers = static_cast<int>(header[1]);
    o.y.resize(layers);
    o.dx.resize(layers);
    o.running.resize(layers);
    for (int l = 0; l < layers; ++l) {
      std::vector<double> nbt;
      if (!GetVector(in, o.y[l]) || !GetVector(in, o.dx[l]) ||
          !GetVector(in, nbt) || nbt.size() != 1 ||
          !GetVector(in, o.running[l].mean) ||
          !GetVector(in, o.running[l].var)) {
        return absl::DataLossError(absl::StrCat("truncated outputs in ", path));
      }
      o.running[l].num_batches_tracked = static_cast<int64_t>(nbt[0]);
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

}  // namespace syncnorm::testing
