// Deterministic contributions for rounds of the fault and soak tests, their
// long-double reference merge, and the log of results the round workers
// write and the tests check.
#ifndef SYNCNORM_TESTS_TESTING_ROUND_PAYLOAD_H_
#define SYNCNORM_TESTS_TESTING_ROUND_PAYLOAD_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/moments.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm::testing {

// The local moments `rank` sends to (job, layer, step, FORWARD): a count in
// [1, 8] and `channels` means and M2s, all fixed by the key, so a restarted
// worker resends exactly what its predecessor sent.
Moments RoundPayload(const std::string& job, int layer, int64_t step, int rank,
                     int channels);

// The payload as a Contribution.
v1::Contribution RoundContribution(const std::string& job, int layer,
                                   int64_t step, int rank, int channels);

// The FORWARD of (job, layer 0, step, rank) for a local batch given as its
// samples per channel (each channel as many): the count, and each
// channel's mean and M2 in two float64 passes.
v1::Contribution SampledForward(
    const std::string& job, int64_t step, int rank,
    const std::vector<std::vector<double>>& samples);

// The merge of `ranks`' payloads in long double (direct sums, not the Chan
// fold the server uses): count, mean and M2.
struct ReferenceMoments {
  int64_t count = 0;
  std::vector<long double> mean, m2;
};
ReferenceMoments ReferenceMerge(const std::string& job, int layer, int64_t step,
                                const std::vector<int>& ranks, int channels);

// "" when `got` (count, mean, biased var) matches `want` within 1e-12
// relative; else what differs.
std::string CheckGlobal(const v1::GlobalMoments& got,
                        const ReferenceMoments& want);

// One line of a round worker's log (see round_worker_main.cc):
//   O job layer step version missing   a completed round ("-" when none)
//   F job layer step code elapsed_ms message   a failed round
//   B job layer step what              a wrong result (a bug)
//   H job layer step elapsed_ms        a call that overran its bound
struct RoundLogEntry {
  char kind = 'O';
  std::string job;
  int layer = 0;
  int64_t step = 0;
  int64_t version = 0;       // O
  std::vector<int> missing;  // O
  int code = 0;              // F
  int64_t elapsed_ms = 0;    // F, H
  std::string text;          // F message, B what
};

// Every entry of the log files; a torn last line (a killed writer) is
// skipped.
std::vector<RoundLogEntry> ReadRoundLogs(const std::vector<std::string>& paths);

// What the logs say about one job: the completed steps of each layer with
// their versions. FAILED_PRECONDITION when the same (layer, step) was
// reported with two versions, or two steps share a version (a double
// count), or versions are not 1..N (an update applied twice or lost).
struct JobRounds {
  // layer -> step -> version
  std::map<int, std::map<int64_t, int64_t>> completed;
};
absl::StatusOr<std::map<std::string, JobRounds>> CollectRounds(
    const std::vector<RoundLogEntry>& entries);

// The running statistics that `rounds` of (job, layer) produce under the
// torch rule with momentum 0.1 and unbiased running var, from the initial
// zeros/ones, replayed in version order in long double.
struct ReferenceRunning {
  int64_t num_batches_tracked = 0;
  std::vector<long double> mean, var;
};
ReferenceRunning ReplayRunning(const std::string& job, int layer,
                               const std::map<int64_t, int64_t>& rounds,
                               int ranks, int channels);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_ROUND_PAYLOAD_H_
