// Bad input, end to end: a table of malformed requests to every RPC of the
// real aggregator binary, each field wrong in each way it can be, every one
// with the status it must get; then the server must still be SERVING, serve
// a good round, and hold unchanged state.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/health.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

using Stub = v1::Aggregator::Stub;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ctx;
}

v1::CreateJobRequest GoodJob(const std::string& id) {
  v1::CreateJobRequest r;
  r.set_job_id(id);
  r.set_world_size(2);
  r.set_round_timeout_ms(2000);
  v1::LayerSpec* l = r.add_layers();
  l->set_name("bn");
  l->set_num_features(2);
  return r;
}

v1::Contribution GoodForward() {
  v1::Contribution c;
  c.set_job_id("bad");
  c.set_layer(0);
  c.set_step(1000);
  c.set_phase(v1::FORWARD);
  c.set_rank(0);
  c.mutable_moments()->set_count(2);
  for (double v : {1.0, 2.0}) c.mutable_moments()->add_mean(v);
  for (double v : {1.0, 1.0}) c.mutable_moments()->add_m2(v);
  return c;
}

// A group of `ranks` added to the request.
void AddGroup(v1::CreateJobRequest& r, const std::vector<int>& ranks) {
  v1::RankGroup* g = r.add_groups();
  for (int rank : ranks) g->add_ranks(rank);
}

// Imported statistics with these values on the contribution.
void SetImported(v1::Contribution& c, const std::vector<double>& mean,
                 const std::vector<double>& var, int64_t count = 0) {
  v1::ImportedStats* i = c.mutable_imported_stats();
  i->set_num_batches_tracked(count);
  for (double m : mean) i->add_running_mean(m);
  for (double v : var) i->add_running_var(v);
}

void SetGradSums(v1::Contribution& c, std::vector<double> dy,
                 std::vector<double> dy_xmu) {
  for (double v : dy) c.mutable_grad_sums()->add_sum_dy(v);
  for (double v : dy_xmu) c.mutable_grad_sums()->add_sum_dy_xmu(v);
}

v1::SetRunningStatsRequest GoodImport() {
  v1::SetRunningStatsRequest r;
  r.set_job_id("bad");
  v1::LayerStats* l = r.add_layers();
  l->set_layer(0);
  l->set_group(0);
  for (double v : {0.5, 0.5}) l->add_running_mean(v);
  for (double v : {2.0, 2.0}) l->add_running_var(v);
  return r;
}

struct Case {
  std::string what;
  grpc::StatusCode code;
  std::function<grpc::Status(Stub&)> call;
  // What the message must say, when it matters; empty: anything.
  std::string says;
};

// The server's --max_message_bytes in this test; gRPC's transport takes
// up to twice that, the service refuses what is over it.
constexpr int kMaxMessageBytes = 1 << 20;
constexpr char kSaysMessageLimit[] = "--max_message_bytes=1048576";

// `c` grown to about `bytes` serialized: channels the job does not have.
void Inflate(v1::Contribution& c, int64_t bytes) {
  const int64_t channels = bytes / 16;
  for (int64_t i = 0; i < channels; ++i) {
    c.mutable_moments()->add_mean(1);
    c.mutable_moments()->add_m2(1);
  }
}

grpc::Status CreateJob(Stub& stub, const v1::CreateJobRequest& r) {
  v1::JobInfo info;
  return stub.CreateJob(Context().get(), r, &info);
}

grpc::Status ReduceOnce(Stub& stub, const v1::Contribution& c) {
  v1::RoundResult r;
  return stub.ReduceOnce(Context().get(), c, &r);
}

// One contribution on a Reduce stream: the in-band error as a status. The
// stream must stay usable: a good contribution to a 1-rank job follows.
grpc::Status ReduceStream(Stub& stub, const v1::Contribution& c) {
  auto ctx = Context();
  auto stream = stub.Reduce(ctx.get());
  v1::RoundResult r;
  if (!stream->Write(c) || !stream->Read(&r)) return stream->Finish();
  grpc::Status s =
      r.has_error()
          ? grpc::Status(static_cast<grpc::StatusCode>(r.error().code()),
                         r.error().message())
          : grpc::Status::OK;
  static int64_t step = 300000;  // after every step the fixture applied
  v1::Contribution good = GoodForward();
  good.set_job_id("single-biased");
  good.set_step(++step);
  v1::RoundResult after;
  if (!stream->Write(good) || !stream->Read(&after) || after.has_error()) {
    return grpc::Status(grpc::INTERNAL, "the stream broke after the error");
  }
  stream->WritesDone();
  stream->Finish();
  return s;
}

std::vector<Case> CreateJobCases() {
  std::vector<Case> cases;
  auto add = [&](std::string what, grpc::StatusCode code,
                 std::function<void(v1::CreateJobRequest&)> mutate,
                 std::string says = "") {
    cases.push_back({"CreateJob: " + what, code,
                     [mutate](Stub& stub) {
                       v1::CreateJobRequest r = GoodJob("fresh-job");
                       mutate(r);
                       return CreateJob(stub, r);
                     },
                     says});
  };
  const auto kInvalid = grpc::INVALID_ARGUMENT;
  add("job_id empty", kInvalid, [](auto& r) { r.set_job_id(""); });
  add("job_id 129 characters", kInvalid,
      [](auto& r) { r.set_job_id(std::string(129, 'a')); });
  add("job_id with '/'", kInvalid, [](auto& r) { r.set_job_id("a/b"); });
  add("job_id with a NUL", kInvalid,
      [](auto& r) { r.set_job_id(std::string("a\0b", 3)); });
  add("world_size 0", kInvalid, [](auto& r) { r.set_world_size(0); });
  add("world_size negative", kInvalid, [](auto& r) { r.set_world_size(-3); });
  add("group_size negative", kInvalid, [](auto& r) { r.set_group_size(-1); });
  add("group_size not dividing", kInvalid, [](auto& r) {
    r.set_world_size(4);
    r.set_group_size(3);
  });
  add("round_timeout_ms negative", kInvalid,
      [](auto& r) { r.set_round_timeout_ms(-1); });
  add(
      "round_timeout_ms INT64_MAX", kInvalid,
      [](auto& r) { r.set_round_timeout_ms(INT64_MAX); },
      "round_timeout_ms is 9223372036854775807; it must be within [0, "
      "86400000]");
  add(
      "round_timeout_ms 24 h + 1 ms", kInvalid,
      [](auto& r) { r.set_round_timeout_ms(86400001); }, "round_timeout_ms");
  add(
      "shard.num_shards negative", kInvalid,
      [](auto& r) { r.mutable_shard()->set_num_shards(-1); },
      "shard.num_shards is -1; it must be positive");
  add("no layers", kInvalid, [](auto& r) { r.clear_layers(); });
  add("num_features 0", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_num_features(0); });
  add("num_features 2^31 - 1", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_num_features(2147483647); });
  add("world_size 2^31 - 1", kInvalid,
      [](auto& r) { r.set_world_size(2147483647); });
  add("num_features negative", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_num_features(-2); });
  add("momentum above 1", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_momentum(1.5); });
  add("momentum negative", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_momentum(-0.1); });
  add("momentum NaN", kInvalid,
      [](auto& r) { r.mutable_layers(0)->set_momentum(NAN); });
  add("momentum_mode unknown", kInvalid, [](auto& r) {
    r.mutable_layers(0)->set_momentum_mode(static_cast<v1::MomentumMode>(7));
  });
  add("initial_running_mean wrong count", kInvalid,
      [](auto& r) { r.mutable_layers(0)->add_initial_running_mean(1); });
  add("initial_running_mean infinite", kInvalid, [](auto& r) {
    r.mutable_layers(0)->add_initial_running_mean(0);
    r.mutable_layers(0)->add_initial_running_mean(INFINITY);
  });
  add("initial_running_var negative", kInvalid, [](auto& r) {
    r.mutable_layers(0)->add_initial_running_var(1);
    r.mutable_layers(0)->add_initial_running_var(-1);
  });
  add("initial_running_var NaN", kInvalid, [](auto& r) {
    r.mutable_layers(0)->add_initial_running_var(NAN);
    r.mutable_layers(0)->add_initial_running_var(1);
  });
  add("quorum.min_ranks negative", kInvalid,
      [](auto& r) { r.mutable_quorum()->set_min_ranks(-1); });
  add("quorum.min_ranks above the group", kInvalid,
      [](auto& r) { r.mutable_quorum()->set_min_ranks(3); });
  add("quorum.grace_ms negative", kInvalid, [](auto& r) {
    r.mutable_quorum()->set_min_ranks(1);
    r.mutable_quorum()->set_grace_ms(-1);
  });
  add("quorum.grace_ms without min_ranks", kInvalid,
      [](auto& r) { r.mutable_quorum()->set_grace_ms(100); });
  add("groups and group_size", kInvalid, [](auto& r) {
    r.set_group_size(1);
    AddGroup(r, {0});
    AddGroup(r, {1});
  });
  add("groups with a rank outside the world", kInvalid, [](auto& r) {
    AddGroup(r, {0});
    AddGroup(r, {2});
  });
  add("groups with a rank twice", kInvalid, [](auto& r) {
    AddGroup(r, {0, 1});
    AddGroup(r, {1});
  });
  add("groups without a rank", kInvalid, [](auto& r) { AddGroup(r, {1}); });
  add("an empty group", kInvalid, [](auto& r) {
    AddGroup(r, {0, 1});
    AddGroup(r, {});
  });
  add("quorum.grace_ms not below the timeout", kInvalid, [](auto& r) {
    r.mutable_quorum()->set_min_ranks(1);
    r.mutable_quorum()->set_grace_ms(2000);
  });
  add("same job_id, other spec", grpc::ALREADY_EXISTS,
      [](auto& r) { r.set_job_id("bad"), r.set_world_size(4); });
  cases.push_back(
      {"CreateJob: message over --max_message_bytes", grpc::RESOURCE_EXHAUSTED,
       [](Stub& stub) {
         v1::CreateJobRequest r = GoodJob("fresh-job");
         r.mutable_layers(0)->set_name(std::string(kMaxMessageBytes, 'n'));
         return CreateJob(stub, r);
       },
       kSaysMessageLimit});
  return cases;
}

std::vector<Case> ContributionCases() {
  std::vector<Case> cases;
  auto add = [&](std::string what, grpc::StatusCode code,
                 std::function<void(v1::Contribution&)> mutate,
                 std::string says = "") {
    v1::Contribution c = GoodForward();
    mutate(c);
    cases.push_back({"ReduceOnce: " + what, code,
                     [c](Stub& stub) { return ReduceOnce(stub, c); }, says});
    cases.push_back({"Reduce stream: " + what, code,
                     [c](Stub& stub) { return ReduceStream(stub, c); }, says});
  };
  const auto kInvalid = grpc::INVALID_ARGUMENT;
  add("job_id unknown", grpc::NOT_FOUND, [](auto& c) { c.set_job_id("nope"); });
  add("job_id empty", grpc::NOT_FOUND, [](auto& c) { c.set_job_id(""); });
  // The error must still fit what a client takes in its trailers.
  add(
      "job_id 100000 characters", grpc::NOT_FOUND,
      [](auto& c) { c.set_job_id(std::string(100000, 'j')); },
      "... (100000 bytes)' not found; job ids have at most 128 characters");
  add("layer out of range", kInvalid, [](auto& c) { c.set_layer(1); });
  add("layer negative", kInvalid, [](auto& c) { c.set_layer(-1); });
  add("step negative", kInvalid, [](auto& c) { c.set_step(-4); });
  add(
      "step INT64_MAX", kInvalid, [](auto& c) { c.set_step(INT64_MAX); },
      "step is 9223372036854775807; steps are within [0, 9007199254740991]");
  add(
      "step 2^53", kInvalid, [](auto& c) { c.set_step(int64_t{1} << 53); },
      "step is 9007199254740992");
  add("rank = world_size", kInvalid, [](auto& c) { c.set_rank(2); });
  add("rank negative", kInvalid, [](auto& c) { c.set_rank(-1); });
  add("phase unspecified", kInvalid,
      [](auto& c) { c.set_phase(v1::PHASE_UNSPECIFIED); });
  add("phase unknown value", kInvalid,
      [](auto& c) { c.set_phase(static_cast<v1::Phase>(9)); });
  add("no payload", kInvalid, [](auto& c) { c.clear_moments(); });
  add("grad_sums in a FORWARD", kInvalid, [](auto& c) {
    SetGradSums(c, {1, 1}, {1, 1});
  });
  add("moments in a BACKWARD", kInvalid,
      [](auto& c) { c.set_phase(v1::BACKWARD); });
  add("mean with too few channels", kInvalid,
      [](auto& c) { c.mutable_moments()->mutable_mean()->RemoveLast(); });
  add("m2 with too few channels", kInvalid,
      [](auto& c) { c.mutable_moments()->mutable_m2()->RemoveLast(); });
  add("too many channels", kInvalid, [](auto& c) {
    c.mutable_moments()->add_mean(0);
    c.mutable_moments()->add_m2(0);
  });
  add("count negative", kInvalid,
      [](auto& c) { c.mutable_moments()->set_count(-2); });
  add("mean NaN", kInvalid,
      [](auto& c) { c.mutable_moments()->set_mean(0, NAN); });
  add("mean infinite", kInvalid,
      [](auto& c) { c.mutable_moments()->set_mean(1, -INFINITY); });
  add("m2 infinite", kInvalid,
      [](auto& c) { c.mutable_moments()->set_m2(1, INFINITY); });
  add("m2 negative", kInvalid,
      [](auto& c) { c.mutable_moments()->set_m2(0, -1); });
  add("BACKWARD sum_dy NaN", kInvalid, [](auto& c) {
    c.set_phase(v1::BACKWARD);
    SetGradSums(c, {NAN, 1}, {1, 1});
  });
  add("BACKWARD sum_dy_xmu infinite", kInvalid, [](auto& c) {
    c.set_phase(v1::BACKWARD);
    SetGradSums(c, {1, 1}, {1, INFINITY});
  });
  add("BACKWARD wrong channel count", kInvalid, [](auto& c) {
    c.set_phase(v1::BACKWARD);
    SetGradSums(c, {1, 1, 1}, {1, 1, 1});
  });
  add("momentum above 1", kInvalid,
      [](auto& c) { c.mutable_momentum()->set_momentum(1.5); });
  add("momentum_mode unknown", kInvalid, [](auto& c) {
    c.mutable_momentum()->set_momentum_mode(static_cast<v1::MomentumMode>(9));
  });
  add("imported_stats of too few channels", kInvalid, [](auto& c) {
    SetImported(c, {0, 0}, {1});
  });
  add("imported_stats var negative", kInvalid, [](auto& c) {
    SetImported(c, {0, 0}, {1, -1});
  });
  add("imported_stats num_batches_tracked negative", kInvalid, [](auto& c) {
    SetImported(c, {0, 0}, {1, 1}, -1);
  });
  add("imported_stats in a BACKWARD", kInvalid, [](auto& c) {
    c.set_phase(v1::BACKWARD);
    SetGradSums(c, {1, 1}, {1, 1});
    SetImported(c, {0, 0}, {1, 1});
  });
  add("global count 1 with an unbiased running var", grpc::FAILED_PRECONDITION,
      [](auto& c) {
        c.set_job_id("single");
        c.mutable_moments()->set_count(1);
        c.mutable_moments()->set_m2(0, 0);
        c.mutable_moments()->set_m2(1, 0);
      });
  add("a step already superseded", grpc::FAILED_PRECONDITION, [](auto& c) {
    c.set_job_id("single-biased");
    c.set_step(5);  // never sent; step 100000 was applied
  });
  // Refused before anything else is looked at (the payload would be
  // INVALID_ARGUMENT too), naming the flag, its value and the size.
  add(
      "message over --max_message_bytes", grpc::RESOURCE_EXHAUSTED,
      [](auto& c) { Inflate(c, kMaxMessageBytes + 4096); }, kSaysMessageLimit);
  // Beyond twice the limit gRPC's transport cuts the message off first,
  // with its own RESOURCE_EXHAUSTED (the stream ends; see docs/operations.md,
  // "Limits").
  add(
      "message over twice --max_message_bytes", grpc::RESOURCE_EXHAUSTED,
      [](auto& c) { Inflate(c, 2 * kMaxMessageBytes + 4096); },
      "larger than max");
  return cases;
}

std::vector<Case> OtherCases() {
  std::vector<Case> cases;
  auto add = [&](std::string what, grpc::StatusCode code,
                 std::function<grpc::Status(Stub&)> call,
                 std::string says = "") {
    cases.push_back({what, code, std::move(call), std::move(says)});
  };
  add("GetJob: job_id unknown", grpc::NOT_FOUND, [](Stub& s) {
    v1::GetJobRequest r;
    r.set_job_id("nope");
    v1::JobInfo info;
    return s.GetJob(Context().get(), r, &info);
  });
  add("DeleteJob: job_id unknown", grpc::NOT_FOUND, [](Stub& s) {
    v1::DeleteJobRequest r;
    r.set_job_id("nope");
    v1::DeleteJobResponse out;
    return s.DeleteJob(Context().get(), r, &out);
  });
  auto stats = [&](std::string what, grpc::StatusCode code,
                   std::function<void(v1::GetRunningStatsRequest&)> mutate,
                   std::string says = "") {
    add(
        "GetRunningStats: " + what, code,
        [mutate](Stub& s) {
          v1::GetRunningStatsRequest r;
          r.set_job_id("bad");
          mutate(r);
          v1::RunningStats out;
          return s.GetRunningStats(Context().get(), r, &out);
        },
        std::move(says));
  };
  stats("job_id unknown", grpc::NOT_FOUND,
        [](auto& r) { r.set_job_id("nope"); });
  stats("layer out of range", grpc::INVALID_ARGUMENT,
        [](auto& r) { r.add_layers(3); });
  stats("layer negative", grpc::INVALID_ARGUMENT,
        [](auto& r) { r.add_layers(-1); });
  stats("group out of range", grpc::INVALID_ARGUMENT,
        [](auto& r) { r.set_group(1); });
  stats("group negative", grpc::INVALID_ARGUMENT,
        [](auto& r) { r.set_group(-1); });
  stats("checkpoint_step without a checkpoint", grpc::NOT_FOUND,
        [](auto& r) { r.set_checkpoint_step(77); });
  stats(
      "checkpoint_step INT64_MAX", grpc::INVALID_ARGUMENT,
      [](auto& r) { r.set_checkpoint_step(INT64_MAX); },
      "checkpoint_step is 9223372036854775807");
  auto import = [&](std::string what, grpc::StatusCode code,
                    std::function<void(v1::SetRunningStatsRequest&)> mutate,
                    std::string says = "") {
    add(
        "SetRunningStats: " + what, code,
        [mutate](Stub& s) {
          v1::SetRunningStatsRequest r = GoodImport();
          mutate(r);
          v1::RunningStats out;
          return s.SetRunningStats(Context().get(), r, &out);
        },
        std::move(says));
  };
  import("job_id unknown", grpc::NOT_FOUND, [](auto& r) { r.set_job_id("nope");
});
  import("no layers", grpc::INVALID_ARGUMENT, [](auto& r) { r.clear_layers();
  }  // namespace
);
  import("layer out of range", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_layer(5);
  }  // namespace syncnorm::testing
);
  import("group out of range", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_group(2);
  });
  import("name of another layer", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_name("other");
  });
  import("running_mean wrong count", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->add_running_mean(1);
  });
  import("running_var NaN", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_running_var(0, NAN);
  });
  import("running_var negative", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_running_var(1, -2);
  });
  import("running_mean infinite", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_running_mean(1, INFINITY);
  });
  import("num_batches_tracked negative", grpc::INVALID_ARGUMENT,
         [](auto& r) { r.mutable_layers(0)->set_num_batches_tracked(-1);
  });
  import(
      "num_batches_tracked INT64_MAX", grpc::INVALID_ARGUMENT,
      [](auto& r) { r.mutable_layers(0)->set_num_batches_tracked(INT64_MAX);
  },
      "num_batches_tracked is 9223372036854775807; it must be within [0, "
      "9007199254740991]");
  import("the same (layer, group) twice", grpc::INVALID_ARGUMENT,
         [](auto& r) { *r.add_layers() = r.layers(0);
  });
  add("Checkpoint: job_id unknown", grpc::NOT_FOUND, [](Stub& s) {
    v1::CheckpointRequest r;
    r.set_job_id("nope");
    v1::CheckpointInfo out;
    return s.Checkpoint(Context().get(), r, &out);
  });
  add("Checkpoint: a step never committed (call deadline)",
      grpc::DEADLINE_EXCEEDED, [](Stub& s) {
        v1::CheckpointRequest r;
        r.set_job_id("bad");
        r.set_step(1 << 30);
        v1::CheckpointInfo out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(300));
        return s.Checkpoint(&ctx, r, &out);
      });
  add(
      "Checkpoint: step INT64_MAX", grpc::INVALID_ARGUMENT,
      [](Stub& s) {
        v1::CheckpointRequest r;
        r.set_job_id("bad");
        r.set_step(INT64_MAX);
        v1::CheckpointInfo out;
        return s.Checkpoint(Context().get(), r, &out);
      },
      "step is 9223372036854775807; steps are within [0, 9007199254740991]");
  add("ListCheckpoints: job_id unknown", grpc::NOT_FOUND, [](Stub& s) {
    v1::ListCheckpointsRequest r;
    r.set_job_id("nope");
    v1::ListCheckpointsResponse out;
    return s.ListCheckpoints(Context().get(), r, &out);
  });
  add("RestoreCheckpoint: job_id unknown", grpc::NOT_FOUND, [](Stub& s) {
    v1::RestoreCheckpointRequest r;
    r.set_job_id("nope");
    v1::JobInfo out;
    return s.RestoreCheckpoint(Context().get(), r, &out);
  });
  add("RestoreCheckpoint: no checkpoint at the step", grpc::NOT_FOUND,
      [](Stub& s) {
        v1::RestoreCheckpointRequest r;
        r.set_job_id("bad");
        r.set_step(12);
        v1::JobInfo out;
        return s.RestoreCheckpoint(Context().get(), r, &out);
      });
  add(
      "RestoreCheckpoint: step INT64_MAX", grpc::INVALID_ARGUMENT,
      [](Stub& s) {
        v1::RestoreCheckpointRequest r;
        r.set_job_id("bad");
        r.set_step(INT64_MAX);
        v1::JobInfo out;
        return s.RestoreCheckpoint(Context().get(), r, &out);
      },
      "step is 9223372036854775807");
  // Elastic membership and staleness (job "bad": world 2, every rank a
  // member, no step completed).
  const auto membership =
      [&](std::string what, grpc::StatusCode code,
          std::function<void(v1::UpdateMembershipRequest&)> fill,
          std::string says = "") {
        add(
            "UpdateMembership: " + what, code,
            [fill](Stub& s) {
              v1::UpdateMembershipRequest r;
              r.set_job_id("bad");
              fill(r);
              v1::JobInfo out;
              return s.UpdateMembership(Context().get(), r, &out);
            },
            std::move(says));
      };
  membership("job_id unknown", grpc::NOT_FOUND, [](auto& r) {
    r.set_job_id("nope");
    r.add_join(1);
  });
  membership(
      "no rank", grpc::INVALID_ARGUMENT, [](auto&) {}, "names no rank");
  membership(
      "rank out of range", grpc::INVALID_ARGUMENT,
      [](auto& r) { r.add_join(2); }, "join rank 2 is out of range");
  membership(
      "negative rank", grpc::INVALID_ARGUMENT,
      [](auto& r) { r.add_remove(-1); }, "out of range");
  membership(
      "a rank named twice", grpc::INVALID_ARGUMENT,
      [](auto& r) {
        r.add_leave(1);
        r.add_remove(1);
      },
      "rank 1 is named twice");
  membership(
      "every member leaves", grpc::INVALID_ARGUMENT,
      [](auto& r) {
        r.add_leave(0);
        r.add_leave(1);
      },
      "without members");
  membership("step negative", grpc::INVALID_ARGUMENT, [](auto& r) {
    r.set_step(-5);
    r.add_leave(1);
  });
  membership(
      "step INT64_MAX", grpc::INVALID_ARGUMENT,
      [](auto& r) {
        r.set_step(INT64_MAX);
        r.add_leave(1);
      },
      "steps are within [0, 9007199254740991]");
  const auto job = [&](std::string what,
                       std::function<void(v1::CreateJobRequest&)> fill,
                       std::string says) {
    add(
        "CreateJob: " + what, grpc::INVALID_ARGUMENT,
        [fill](Stub& s) {
          v1::CreateJobRequest r = GoodJob("fresh-elastic");
          fill(r);
          return CreateJob(s, r);
        },
        std::move(says));
  };
  job(
      "members out of range", [](auto& r) { r.add_members(2); },
      "members has rank 2");
  job(
      "members repeated",
      [](auto& r) {
        r.add_members(0);
        r.add_members(0);
      },
      "members has rank 0 twice");
  job(
      "staleness negative", [](auto& r) { r.set_staleness(-1); },
      "staleness is -1");
  job(
      "staleness above its bound", [](auto& r) { r.set_staleness(65); },
      "staleness is 65");
  job(
      "staleness with a quorum",
      [](auto& r) {
        r.set_staleness(1);
        r.mutable_quorum()->set_min_ranks(1);
        r.mutable_quorum()->set_grace_ms(10);
      },
      "drop the quorum");
  add(
      "ReduceOnce: momentum in a stale-synchronous job", grpc::INVALID_ARGUMENT,
      [](Stub& s) {
        v1::Contribution c = GoodForward();
        c.set_job_id("stale");
        c.mutable_momentum()->set_momentum_mode(v1::MOMENTUM_TORCH);
        c.mutable_momentum()->set_momentum(0.5);
        return ReduceOnce(s, c);
      },
      "stale-synchronous job");
  return cases;
  }

  TEST(BadInputTest, EveryMalformedRequestGetsItsStatusAndTheServerServesOn) {
    const std::string dir = MakeScratchDir("bad-input");
    auto agg = AggregatorProcess::Start(
        dir, {absl::StrCat("--max_message_bytes=", kMaxMessageBytes)});
    ASSERT_TRUE(agg.ok()) << agg.status();
    auto channel = grpc::CreateChannel((*agg)->address(),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Aggregator::NewStub(channel);
    ASSERT_TRUE(CreateJob(*stub, GoodJob("bad")).ok());
    v1::CreateJobRequest stale = GoodJob("stale");
    stale.set_staleness(2);
    ASSERT_TRUE(CreateJob(*stub, stale).ok());
    v1::CreateJobRequest single = GoodJob("single");
    single.set_world_size(1);
    ASSERT_TRUE(CreateJob(*stub, single).ok());
    single.set_job_id("single-biased");
    single.mutable_layers(0)->set_biased_running_var(true);
    ASSERT_TRUE(CreateJob(*stub, single).ok());
    // Step 0 of single-biased completes, so later rounds of it are fine and
    // step 0 is superseded once step 1 is applied.
    v1::Contribution first = GoodForward();
    first.set_job_id("single-biased");
    first.set_step(0);
    ASSERT_TRUE(ReduceOnce(*stub, first).ok());
    first.set_step(100000);
    ASSERT_TRUE(ReduceOnce(*stub, first).ok());
    v1::RunningStats before;
    {
      v1::GetRunningStatsRequest r;
      r.set_job_id("bad");
      ASSERT_TRUE(stub->GetRunningStats(Context().get(), r, &before).ok());
    }

    std::vector<Case> cases = CreateJobCases();
    for (auto* more : {&ContributionCases, &OtherCases}) {
      for (Case& c : more()) cases.push_back(std::move(c));
    }
    ASSERT_GE(cases.size(), 30u);
    for (const Case& c : cases) {
      const grpc::Status s = c.call(*stub);
      EXPECT_EQ(s.error_code(), c.code)
          << c.what << ": got " << s.error_code() << " " << s.error_message();
      EXPECT_FALSE(s.error_message().empty()) << c.what;
      EXPECT_TRUE(absl::StrContains(s.error_message(), c.says))
          << c.what << ": the message should say '" << c.says
          << "': " << s.error_message();
    }
    std::fprintf(stderr, "%zu malformed requests checked\n", cases.size());

    // Still SERVING, still serving, and nothing changed.
    auto health = CheckHealth(channel);
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, 1) << "SERVING";
    v1::RunningStats after;
    {
      v1::GetRunningStatsRequest r;
      r.set_job_id("bad");
      ASSERT_TRUE(stub->GetRunningStats(Context().get(), r, &after).ok());
    }
    EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
    v1::GetJobRequest get;
    get.set_job_id("fresh-job");
    v1::JobInfo info;
    EXPECT_EQ(stub->GetJob(Context().get(), get, &info).error_code(),
              grpc::NOT_FOUND)
        << "no malformed CreateJob created a job";
    v1::Contribution good = GoodForward();
    good.set_job_id("single-biased");
    good.set_step(900000);
    EXPECT_TRUE(ReduceOnce(*stub, good).ok());
    auto code = (*agg)->Stop();
    EXPECT_TRUE(code.ok() && *code == 0);
  }

  // ---- Numbers that overflow -----------------------------------------------

  struct RankAnswer {
    grpc::Status status;
    v1::RoundResult result;
  };

  // One round: each contribution (one per rank) sent by ReduceOnce from its
  // own thread, as separate workers would; the answers in the same order.
  std::vector<RankAnswer> RunRound(Stub& stub,
                                   const std::vector<v1::Contribution>& cs) {
    std::vector<RankAnswer> out(cs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < cs.size(); ++i) {
      threads.emplace_back([&, i] {
        out[i].status = stub.ReduceOnce(Context().get(), cs[i], &out[i].result);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  v1::Contribution Moments(const std::string& job, int64_t step, int rank,
                           int64_t count, std::vector<double> mean,
                           std::vector<double> m2) {
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.set_rank(rank);
    c.mutable_moments()->set_count(count);
    for (double v : mean) c.mutable_moments()->add_mean(v);
    for (double v : m2) c.mutable_moments()->add_m2(v);
    return c;
  }

  v1::Contribution Sums(const std::string& job, int64_t step, int rank,
                        std::vector<double> dy, std::vector<double> dy_xmu) {
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::BACKWARD);
    c.set_rank(rank);
    SetGradSums(c, std::move(dy), std::move(dy_xmu));
    return c;
  }

  // A rank's moments of `values` (one channel), computed by sums in long
  // double: the test's own arithmetic, not the server's formulas.
  v1::Contribution MomentsOf(const std::string& job, int64_t step, int rank,
                             const std::vector<double>& values) {
    long double sum = 0, m2 = 0;
    for (double v : values) sum += v;
    const long double mean = sum / values.size();
    for (double v : values) m2 += (v - mean) * (v - mean);
    return Moments(job, step, rank, values.size(), {static_cast<double>(mean)},
                   {static_cast<double>(m2)});
  }

  v1::RunningStats StatsOf(Stub& stub, const std::string& job) {
    v1::GetRunningStatsRequest r;
    r.set_job_id(job);
    v1::RunningStats out;
    EXPECT_TRUE(stub.GetRunningStats(Context().get(), r, &out).ok());
    return out;
  }

  int64_t CommittedStep(Stub& stub, const std::string& job) {
    v1::GetJobRequest r;
    r.set_job_id(job);
    v1::JobInfo info;
    EXPECT_TRUE(stub.GetJob(Context().get(), r, &info).ok());
    return info.committed_step();
  }

  grpc::Status Import(Stub& stub, const std::string& job, double mean,
                      double var, int64_t num_batches_tracked) {
    v1::SetRunningStatsRequest r;
    r.set_job_id(job);
    v1::LayerStats* l = r.add_layers();
    l->add_running_mean(mean);
    l->add_running_var(var);
    l->set_num_batches_tracked(num_batches_tracked);
    v1::RunningStats out;
    return stub.SetRunningStats(Context().get(), r, &out);
  }

  // Finite contributions whose merge overflows float64, counts that sum past
  // INT64_MAX, running statistics an update would make infinite and a
  // num_batches_tracked at its bound: each round fails for every rank with
  // its status, names what overflowed, and leaves the running statistics and
  // the committed step as they were; a retry gets the same answer, and the
  // next good round is served, equal to a long-double reference.
  TEST(BadInputTest, RoundsThatWouldOverflowFailAndChangeNothing) {
    const std::string dir = MakeScratchDir("bad-input-overflow");
    auto agg = AggregatorProcess::Start(dir);
    ASSERT_TRUE(agg.ok()) << agg.status();
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
        (*agg)->address(), grpc::InsecureChannelCredentials()));
    v1::CreateJobRequest wide = GoodJob("wide");
    wide.mutable_layers(0)->set_num_features(1);
    ASSERT_TRUE(CreateJob(*stub, wide).ok());
    v1::CreateJobRequest cumulative = GoodJob("cumulative");
    cumulative.set_world_size(1);
    cumulative.mutable_layers(0)->set_num_features(1);
    cumulative.mutable_layers(0)->set_momentum_mode(v1::MOMENTUM_CUMULATIVE);
    ASSERT_TRUE(CreateJob(*stub, cumulative).ok());
    // Step 0 of "wide" is applied, so a later failure has state to keep.
    const std::vector<double> x0 = {1.5, -2.0, 4.25}, x1 = {0.5, 3.0};
    for (const RankAnswer& a : RunRound(*stub, {MomentsOf("wide", 0, 0, x0),
                                                MomentsOf("wide", 0, 1, x1)})) {
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    }
    const v1::RunningStats before = StatsOf(*stub, "wide");
    ASSERT_EQ(before.layers(0).num_batches_tracked(), 1);
    const std::string kept = before.SerializeAsString();

    struct Overflow {
      std::string what;
      std::vector<v1::Contribution> round;
      grpc::StatusCode code;
      std::string says;
    };
    const double big = 1e308;
    const std::vector<Overflow> overflows = {
        {"means of opposite signs",
         {Moments("wide", 1, 0, 2, {big}, {big}),
          Moments("wide", 1, 1, 2, {-big}, {big})},
         grpc::INVALID_ARGUMENT,
         "merging the ranks' moments overflows float64: mean[0] is -inf"},
        {"m2 that sums past the float64 maximum",
         {Moments("wide", 2, 0, 2, {1}, {1.5 * big}),
          Moments("wide", 2, 1, 2, {1}, {1.5 * big})},
         grpc::INVALID_ARGUMENT,
         "merging the ranks' moments overflows float64: var[0] is inf"},
        {"counts 2^62 + 2^62",
         {Moments("wide", 3, 0, int64_t{1} << 62, {0}, {0}),
          Moments("wide", 3, 1, int64_t{1} << 62, {0}, {0})},
         grpc::INVALID_ARGUMENT,
         "rank 1's count does not fit: counts 4611686018427387904 + "
         "4611686018427387904 sum past 2^63-1"},
        {"counts INT64_MAX + 1",
         {Moments("wide", 4, 0, INT64_MAX, {0}, {0}),
          Moments("wide", 4, 1, 1, {0}, {0})},
         grpc::INVALID_ARGUMENT,
         "sum past 2^63-1"},
    };
    for (const Overflow& o : overflows) {
      for (int attempt = 0; attempt < 2; ++attempt) {  // then a retry
        for (const RankAnswer& a : RunRound(*stub, o.round)) {
          EXPECT_EQ(a.status.error_code(), o.code)
              << o.what << ": " << a.status.error_message();
          EXPECT_TRUE(absl::StrContains(a.status.error_message(), o.says))
              << o.what << ": should say '" << o.says
              << "': " << a.status.error_message();
          EXPECT_TRUE(absl::StrContains(a.status.error_message(),
                                        "the round was not applied"))
              << o.what;
        }
      }
      EXPECT_EQ(StatsOf(*stub, "wide").SerializeAsString(), kept) << o.what;
      EXPECT_EQ(CommittedStep(*stub, "wide"), 0) << o.what;
    }

    // Gradient sums that overflow when summed: the backward round of step 0.
    for (const RankAnswer& a :
         RunRound(*stub, {Sums("wide", 0, 0, {big}, {1}),
                          Sums("wide", 0, 1, {big}, {1})})) {
      EXPECT_EQ(a.status.error_code(), grpc::INVALID_ARGUMENT);
      EXPECT_TRUE(absl::StrContains(
          a.status.error_message(),
          "summing the ranks' gradient sums overflows float64: sum_dy[0] is "
          "inf"))
          << a.status.error_message();
    }

    // The next good round, against the long-double mean and biased var of
    // the concatenated batch and torch's running-statistics rule.
    const std::vector<double> y0 = {2.0, 7.5}, y1 = {-1.25, 0.0, 3.5};
    std::vector<RankAnswer> good = RunRound(
        *stub, {MomentsOf("wide", 5, 0, y0), MomentsOf("wide", 5, 1, y1)});
    long double sum = 0, sq = 0;
    for (const auto* v : {&y0, &y1}) {
      for (double y : *v) sum += y;
    }
    const long double mean = sum / 5;
    for (const auto* v : {&y0, &y1}) {
      for (double y : *v) sq += (y - mean) * (y - mean);
    }
    for (const RankAnswer& a : good) {
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
      EXPECT_EQ(a.result.moments().count(), 5);
      EXPECT_NEAR(a.result.moments().mean(0), static_cast<double>(mean), 1e-15);
      EXPECT_NEAR(a.result.moments().var(0), static_cast<double>(sq / 5),
                  1e-14);
      EXPECT_EQ(a.result.version(), 2);
    }
    const v1::RunningStats now = StatsOf(*stub, "wide");
    const v1::LayerStats& running = now.layers(0);
    EXPECT_NEAR(running.running_mean(0),
                0.9 * before.layers(0).running_mean(0) + 0.1 * mean, 1e-15);
    EXPECT_NEAR(running.running_var(0),
                0.9 * before.layers(0).running_var(0) + 0.1 * (sq / 4), 1e-14);
    EXPECT_EQ(CommittedStep(*stub, "wide"), 5);

    // A cumulative average whose update overflows: running mean -1e308 and a
    // batch mean of 1e308.
    ASSERT_TRUE(Import(*stub, "cumulative", -big, 1, 1).ok());
    const std::string imported =
        StatsOf(*stub, "cumulative").SerializeAsString();
    v1::RoundResult result;
    grpc::Status s = stub->ReduceOnce(
        Context().get(), Moments("cumulative", 0, 0, 2, {big}, {0}), &result);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
    EXPECT_TRUE(absl::StrContains(
        s.error_message(),
        "updating the running statistics overflows float64: running_mean[0] "
        "is inf"))
        << s.error_message();
    EXPECT_EQ(StatsOf(*stub, "cumulative").SerializeAsString(), imported);
    EXPECT_EQ(CommittedStep(*stub, "cumulative"), -1);

    // num_batches_tracked at its bound (2^53 - 1): no round can count one
    // more. One below it: the round makes it the bound.
    constexpr int64_t kMaxVersion = (int64_t{1} << 53) - 1;
    ASSERT_TRUE(Import(*stub, "cumulative", 0, 1, kMaxVersion).ok());
    s = stub->ReduceOnce(Context().get(),
                         Moments("cumulative", 1, 0, 2, {1}, {1}), &result);
    EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(),
                                  "num_batches_tracked is 9007199254740991"))
        << s.error_message();
    EXPECT_EQ(StatsOf(*stub, "cumulative").layers(0).num_batches_tracked(),
              kMaxVersion);
    ASSERT_TRUE(Import(*stub, "cumulative", 0, 1, kMaxVersion - 1).ok());
    s = stub->ReduceOnce(Context().get(),
                         Moments("cumulative", 2, 0, 2, {1}, {1}), &result);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(result.version(), kMaxVersion);

    // A step at INT64_MAX is refused and the committed step stays.
    s = stub->ReduceOnce(Context().get(),
                         Moments("cumulative", INT64_MAX, 0, 2, {1}, {1}),
                         &result);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(CommittedStep(*stub, "cumulative"), 2);

    auto code = (*agg)->Stop();
    EXPECT_TRUE(code.ok() && *code == 0);
  }

  // ---- Strings a client chose, echoed bounded ------------------------------

  // A job_id, tag or layer name far longer than any valid one.
  std::string Huge(const std::string& prefix) {
    return prefix + std::string(200000 - prefix.size(), 'x');
  }

  // A layer name or tag as long as one may be (kMaxNameBytes, 1024 bytes):
  // valid, and longer than what messages show whole.
  std::string Long(const std::string& prefix) {
    return prefix + std::string(1024 - prefix.size(), 'x');
  }

  // "" when `s` has `code` and a short message that still names `text` by
  // its first 128 bytes and its size; else what is wrong.
  std::string EchoesBounded(const grpc::Status& s, grpc::StatusCode code,
                            const std::string& text) {
    const std::string shown =
        absl::StrCat(text.substr(0, 128), "... (", text.size(), " bytes)");
    if (s.error_code() == code && s.error_message().size() < 1024 &&
        absl::StrContains(s.error_message(), shown)) {
      return "";
    }
    return absl::StrCat("expected code ", code,
                        " and a message under 1 kB with '", text.substr(0, 16),
                        "...", "' (", text.size(), " bytes) bounded; got code ",
                        s.error_code(), ", ", s.error_message().size(),
                        " bytes: ", s.error_message().substr(0, 400));
  }

  std::string ReadLog(const std::string& dir) {
    std::ifstream in(dir + "/aggregator.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Every job-scoped RPC with `job_id`, as `token` (empty: none): the
  // statuses, named.
  std::vector<std::pair<std::string, grpc::Status>> CallEveryRpc(
      Stub& stub, const std::string& job_id, const std::string& token) {
    auto ctx = [&token] {
      auto c = Context();
      if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
      return c;
    };
    std::vector<std::pair<std::string, grpc::Status>> out;
    {
      v1::GetJobRequest r;
      r.set_job_id(job_id);
      v1::JobInfo info;
      out.emplace_back("GetJob", stub.GetJob(ctx().get(), r, &info));
    }
    {
      v1::DeleteJobRequest r;
      r.set_job_id(job_id);
      v1::DeleteJobResponse response;
      out.emplace_back("DeleteJob", stub.DeleteJob(ctx().get(), r, &response));
    }
    {
      v1::Contribution c = GoodForward();
      c.set_job_id(job_id);
      v1::RoundResult result;
      out.emplace_back("ReduceOnce", stub.ReduceOnce(ctx().get(), c, &result));
      auto stream_ctx = ctx();
      auto stream = stub.Reduce(stream_ctx.get());
      grpc::Status in_band(grpc::INTERNAL, "the stream broke");
      if (stream->Write(c) && stream->Read(&result)) {
        in_band =
            grpc::Status(static_cast<grpc::StatusCode>(result.error().code()),
                         result.error().message());
      }
      stream->WritesDone();
      (void)stream->Finish();
      out.emplace_back("Reduce (in-band)", in_band);
    }
    {
      v1::GetRunningStatsRequest r;
      r.set_job_id(job_id);
      v1::RunningStats stats;
      out.emplace_back("GetRunningStats",
                       stub.GetRunningStats(ctx().get(), r, &stats));
    }
    {
      v1::SetRunningStatsRequest r = GoodImport();
      r.set_job_id(job_id);
      v1::RunningStats stats;
      out.emplace_back("SetRunningStats",
                       stub.SetRunningStats(ctx().get(), r, &stats));
    }
    {
      v1::CheckpointRequest r;
      r.set_job_id(job_id);
      v1::CheckpointInfo info;
      out.emplace_back("Checkpoint", stub.Checkpoint(ctx().get(), r, &info));
    }
    {
      v1::ListCheckpointsRequest r;
      r.set_job_id(job_id);
      v1::ListCheckpointsResponse list;
      out.emplace_back("ListCheckpoints",
                       stub.ListCheckpoints(ctx().get(), r, &list));
    }
    {
      v1::RestoreCheckpointRequest r;
      r.set_job_id(job_id);
      v1::JobInfo info;
      out.emplace_back("RestoreCheckpoint",
                       stub.RestoreCheckpoint(ctx().get(), r, &info));
    }
    return out;
  }

  // A job_id, a layer name or a checkpoint tag of 200 kB: every status that
  // echoes it names it by its first 128 bytes and its size, and the server's
  // log never holds it whole.
  TEST(BadInputTest, ClientStringsInMessagesAndLogsAreBounded) {
    const std::string dir = MakeScratchDir("bad-input-echo");
    auto agg = AggregatorProcess::Start(
        dir, {absl::StrCat("--max_message_bytes=", kMaxMessageBytes)});
    ASSERT_TRUE(agg.ok()) << agg.status();
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
        (*agg)->address(), grpc::InsecureChannelCredentials()));

    const std::string id = Huge("huge-job-");
    for (const auto& [rpc, status] : CallEveryRpc(*stub, id, "")) {
      EXPECT_EQ(EchoesBounded(status, grpc::NOT_FOUND, id), "") << rpc;
    }
    v1::CreateJobRequest create = GoodJob(id);
    grpc::Status created = CreateJob(*stub, create);
    EXPECT_EQ(created.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_LT(created.error_message().size(), 1024u);

    // A layer name of more than kMaxNameBytes is refused, naming it bounded.
    create = GoodJob("named");
    create.set_world_size(1);
    const std::string huge_name = Huge("huge-layer-");
    create.mutable_layers(0)->set_name(huge_name);
    grpc::Status refused = CreateJob(*stub, create);
    EXPECT_EQ(EchoesBounded(refused, grpc::INVALID_ARGUMENT, huge_name), "");
    EXPECT_TRUE(absl::StrContains(refused.error_message(), "at most 1024"))
        << refused.error_message();
    // One within it is any string, longer than what messages show whole;
    // messages about the layer quote it bounded.
    const std::string name = Long("long-layer-");
    create.mutable_layers(0)->set_name(name);
    create.mutable_layers(0)->set_num_features(0);
    EXPECT_EQ(
        EchoesBounded(CreateJob(*stub, create), grpc::INVALID_ARGUMENT, name),
        "");
    create.mutable_layers(0)->set_num_features(2);
    create.mutable_layers(0)->set_biased_running_var(true);
    ASSERT_TRUE(CreateJob(*stub, create).ok());
    v1::Contribution wrong = GoodForward();
    wrong.set_job_id("named");
    wrong.set_step(0);
    wrong.mutable_moments()->add_mean(0);
    wrong.mutable_moments()->add_m2(0);
    EXPECT_EQ(
        EchoesBounded(ReduceOnce(*stub, wrong), grpc::INVALID_ARGUMENT, name),
        "");
    v1::SetRunningStatsRequest import = GoodImport();
    import.set_job_id("named");
    const std::string other = Huge("other-layer-");
    import.mutable_layers(0)->set_name(other);
    v1::RunningStats stats;
    EXPECT_EQ(
        EchoesBounded(stub->SetRunningStats(Context().get(), import, &stats),
                      grpc::INVALID_ARGUMENT, other),
        "");

    // A tag of more than kMaxNameBytes is refused and nothing is stored; one
    // within it is stored as given, logged, and quoted when it conflicts.
    v1::Contribution good = GoodForward();
    good.set_job_id("named");
    good.set_step(0);
    ASSERT_TRUE(ReduceOnce(*stub, good).ok());
    const std::string huge_tag = Huge("huge-tag-");
    v1::CheckpointRequest checkpoint;
    checkpoint.set_job_id("named");
    checkpoint.set_step(0);
    checkpoint.set_tag(huge_tag);
    v1::CheckpointInfo info;
    EXPECT_EQ(
        EchoesBounded(stub->Checkpoint(Context().get(), checkpoint, &info),
                      grpc::INVALID_ARGUMENT, huge_tag),
        "");
    {
      v1::ListCheckpointsRequest list;
      list.set_job_id("named");
      v1::ListCheckpointsResponse listed;
      ASSERT_TRUE(stub->ListCheckpoints(Context().get(), list, &listed).ok());
      EXPECT_EQ(listed.checkpoints_size(), 0) << "a refused tag stored nothing";
    }
    const std::string tag = Long("long-tag-");
    checkpoint.set_tag(tag);
    ASSERT_TRUE(stub->Checkpoint(Context().get(), checkpoint, &info).ok());
    EXPECT_EQ(info.tag(), tag) << "the tag itself is kept whole";
    checkpoint.set_tag("another");
    EXPECT_EQ(
        EchoesBounded(stub->Checkpoint(Context().get(), checkpoint, &info),
                      grpc::ALREADY_EXISTS, tag),
        "");

    auto code = (*agg)->Stop();
    EXPECT_TRUE(code.ok() && *code == 0);
    const std::string log = ReadLog(dir);
    EXPECT_TRUE(absl::StrContains(log, "event=checkpoint job=named"));
    EXPECT_FALSE(absl::StrContains(log, std::string(1000, 'x')))
        << "the log holds a client's string whole: " << log.size() << " bytes";
    EXPECT_LT(log.size(), 64u << 10);
  }

  // With bearer tokens, a token for job "bad" asking for a job of 200 kB's id
  // is PERMISSION_DENIED naming that id bounded, on every RPC.
  TEST(BadInputTest, PermissionDeniedNamesTheJobBounded) {
    const std::string dir = MakeScratchDir("bad-input-auth");
    const std::string token = "bad-job-token-0123456789abcdef";
    {
      std::ofstream tokens(dir + "/tokens");
      tokens << token << " job:bad\n";
    }
    auto agg = AggregatorProcess::Start(
        dir, {absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
              "--tokens_file=" + dir + "/tokens"});
    ASSERT_TRUE(agg.ok()) << agg.status();
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
        (*agg)->address(), grpc::InsecureChannelCredentials()));
    const std::string id = Huge("huge-job-");
    for (const auto& [rpc, status] : CallEveryRpc(*stub, id, token)) {
      EXPECT_EQ(EchoesBounded(status, grpc::PERMISSION_DENIED, id), "") << rpc;
    }
    auto code = (*agg)->Stop();
    EXPECT_TRUE(code.ok() && *code == 0);
    EXPECT_FALSE(absl::StrContains(ReadLog(dir), std::string(1000, 'x')));
  }

  }  // namespace
  }  // namespace syncnorm::testing
