// libFuzzer target over what the server does with bytes it did not make:
// request validation (a Contribution or CreateJobRequest parsed from the
// input, through the proto conversion, into an in-memory Aggregator with a
// few jobs, quorum and explicit groups included) and the state decoder
// (every record kind of server/store/state_codec.h). The first input byte picks
// the path. Any crash, sanitizer report or broken promise (a callback not
// called exactly once) is a finding.
//
// Built and run outside Bazel by tests/fuzz/run_fuzz.sh (clang
// -fsanitize=fuzzer,address), over the seeds in tests/fuzz/corpus/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/rpc/proto_convert.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/state_codec.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {
namespace {

JobSpec FuzzJob(const std::string& id, int world, int group, int channels,
                int min_ranks, std::vector<std::vector<int>> groups = {}) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.group_size = group;
  s.groups = std::move(groups);
  s.round_timeout = absl::Seconds(1);
  for (int l = 0; l < 2; ++l) {
    LayerConfig layer;
    layer.name = "bn";
    layer.channels = channels;
    s.layers.push_back(layer);
  }
  s.quorum.min_ranks = min_ranks;
  s.quorum.grace =
      min_ranks > 0 ? absl::Milliseconds(100) : absl::ZeroDuration();
  return s;
}

struct World {
  World() : aggregator(Options(), &clock, &store) {
    for (const JobSpec& s : {FuzzJob("a", 2, 0, 2, 0), FuzzJob("b", 4, 2, 3, 1),
                             FuzzJob("c", 1, 0, 1, 0),
                             FuzzJob("d", 5, 0, 2, 1, {{0, 2}, {1, 3, 4}})}) {
      if (!aggregator.CreateJob(s).ok()) std::abort();
      specs.push_back(*ResolveJobSpec(s, absl::Seconds(1)));
    }
  }
  static AggregatorOptions Options() {
    AggregatorOptions o;
    o.observer = &observer;
    return o;
  }
  static inline NoopRoundObserver observer;
  FakeClock clock;
  KvStateStore store{std::make_unique<MemoryEngine>()};
  Aggregator aggregator;
  std::vector<JobSpec> specs;
};

World& TheWorld() {
  static World* world = new World;
  return *world;
}

void FuzzContribution(World& w, const uint8_t* data, size_t size) {
  v1::Contribution proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return;
  int calls = 0;
  std::optional<RelayBlock> block;
  if (proto.has_relay()) {
    absl::StatusOr<RelayBlock> b = RelayBlockFromProto(proto.relay());
    if (!b.ok()) return;  // refused before the aggregator, as the service does
    block = *std::move(b);
  }
  Contribution c = ContributionFromProto(std::move(proto));
  c.block = std::move(block);
  w.aggregator.Contribute(std::move(c),
                          [&calls](const RoundOutcome&) { ++calls; });
  // Rounds waiting for other ranks are answered at their deadline.
  w.clock.Advance(absl::Seconds(2));
  w.aggregator.ExpireRounds(w.clock.Now());
  if (calls != 1) std::abort();
}

void FuzzCreateJob(World& w, const uint8_t* data, size_t size) {
  v1::CreateJobRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return;
  const JobSpec spec = JobSpecFromProto(proto);
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, absl::Seconds(1));
  if (resolved.ok()) {
    // A valid spec survives the store's encoding unchanged.
    absl::StatusOr<JobSpec> back = DecodeJob(EncodeJob(*resolved));
    if (!back.ok() || !(*back == *resolved)) std::abort();
    // Created and deleted again, so the job table stays small.
    if (resolved->job_id.size() > 1 && w.aggregator.CreateJob(spec).ok()) {
      (void)w.aggregator.DeleteJob(resolved->job_id);
    }
  }
}

void FuzzDecoders(World& w, uint8_t which, const uint8_t* data, size_t size) {
  const absl::string_view value(reinterpret_cast<const char*>(data), size);
  const JobSpec& spec = w.specs[which % w.specs.size()];
  switch (which % 4) {
    case 0: {
      absl::StatusOr<JobSpec> job = DecodeJob(value);
      if (job.ok() && !ResolveJobSpec(*job, absl::Seconds(1)).ok())
        std::abort();
      break;
    }
    case 1:
      (void)DecodeLayer(value, spec.layers[0]);
      break;
    case 2: {
      const int group = spec.num_groups() - 1;
      absl::StatusOr<StoredRound> round = DecodeRound(value, spec, group, 1);
      if (round.ok() &&
          round->fingerprints.size() != GroupRanks(spec, group).size()) {
        std::abort();
      }
      break;
    }
    default:
      (void)DecodeCheckpoint(value, spec);
      break;
  }
}

}  // namespace
}  // namespace syncnorm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  syncnorm::World& w = syncnorm::TheWorld();
  const uint8_t mode = data[0];
  switch (mode % 3) {
    case 0:
      syncnorm::FuzzContribution(w, data + 1, size - 1);
      break;
    case 1:
      syncnorm::FuzzCreateJob(w, data + 1, size - 1);
      break;
    default:
      syncnorm::FuzzDecoders(w, mode / 3, data + 1, size - 1);
      break;
  }
  return 0;
}
