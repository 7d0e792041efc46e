// interop-contributor: one C++ rank of the interop test. Runs --steps
// training steps of layer 0 (a FORWARD then a BACKWARD round each) through
// the C++ client's Contributor, with deterministic local values derived from
// (rank, step, channel), and prints every contribution and its result as one
// JSON line {"sent": Contribution, "result": RoundResult} (protobuf's JSON
// mapping, field names as in the .proto). Exits 1 at the first failed round.
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/client_options.h"
#include "client/contributor.h"
#include "google/protobuf/util/json_util.h"
#include "syncnorm/v1/aggregator.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "the aggregator");
ABSL_FLAG(std::string, job_id, "interop", "an existing job");
ABSL_FLAG(int, rank, 0, "this contributor's rank");
ABSL_FLAG(int, channels, 4, "channels of layer 0");
ABSL_FLAG(int, steps, 3, "training steps (forward + backward each)");

namespace {

// Local moments of `rank` at `step`: uneven counts, and rank 1 has an empty
// batch at step 1 (count 0 with zeros, as the contract asks).
syncnorm::v1::Moments LocalMoments(int rank, int step, int channels) {
  syncnorm::v1::Moments m;
  const int count = (rank == 1 && step == 1) ? 0 : 3 + 2 * rank + step;
  m.set_count(count);
  for (int c = 0; c < channels; ++c) {
    m.add_mean(count == 0 ? 0.0 : std::sin(1.0 + 7 * rank + 3 * step + c));
    m.add_m2(count == 0 ? 0.0 : count * (0.5 + 0.1 * c + 0.05 * rank));
  }
  return m;
}

syncnorm::v1::GradSums LocalGradSums(int rank, int step, int channels) {
  syncnorm::v1::GradSums g;
  for (int c = 0; c < channels; ++c) {
    g.add_sum_dy(std::cos(2.0 + 5 * rank + step + c) / 3.0);
    g.add_sum_dy_xmu(0.1 * (rank + 1) - 0.01 * c * step);
  }
  return g;
}

// Sends one contribution and prints it with its result; false on failure.
bool RunRound(syncnorm::Contributor& contributor,
              const syncnorm::v1::Contribution& sent) {
  absl::StatusOr<syncnorm::v1::RoundResult> result = contributor.Round(sent);
  if (!result.ok()) {
    std::fprintf(stderr, "interop-contributor: rank %d step %lld: %s\n",
                 sent.rank(), static_cast<long long>(sent.step()),
                 result.status().ToString().c_str());
    return false;
  }
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string sent_json;
  std::string result_json;
  if (!google::protobuf::util::MessageToJsonString(sent, &sent_json, options)
           .ok() ||
      !google::protobuf::util::MessageToJsonString(*result, &result_json,
                                                   options)
           .ok()) {
    std::fprintf(stderr, "interop-contributor: cannot print JSON\n");
    return false;
  }
  std::printf("{\"sent\":%s,\"result\":%s}\n", sent_json.c_str(),
              result_json.c_str());
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  syncnorm::ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.rpc_timeout = absl::Seconds(20);
  options.round_timeout = absl::Seconds(30);
  syncnorm::Client client(options);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int channels = absl::GetFlag(FLAGS_channels);
  std::unique_ptr<syncnorm::Contributor> contributor =
      client.NewContributor(absl::GetFlag(FLAGS_job_id), rank);

  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    syncnorm::v1::Contribution c;
    c.set_job_id(absl::GetFlag(FLAGS_job_id));
    c.set_layer(0);
    c.set_step(step);
    c.set_rank(rank);
    c.set_phase(syncnorm::v1::FORWARD);
    *c.mutable_moments() = LocalMoments(rank, step, channels);
    if (!RunRound(*contributor, c)) return 1;
    c.set_phase(syncnorm::v1::BACKWARD);
    *c.mutable_grad_sums() = LocalGradSums(rank, step, channels);
    if (!RunRound(*contributor, c)) return 1;
  }
  return 0;
}
