// Rounds of a job from W ranks with normally distributed data, as threads
// of the test, for tests that watch the aggregator's metrics: each rank
// draws its batch, sends its moments (and gradient sums), and gets the
// global statistics. One rank may send shifted data (a planted outlier).
#ifndef SYNCNORM_TESTS_TESTING_RANK_LOAD_H_
#define SYNCNORM_TESTS_TESTING_RANK_LOAD_H_

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/moments.h"

namespace syncnorm::testing {

struct RankLoadOptions {
  std::string address;  // the aggregator
  std::string job_id;   // created by RunRankLoad
  int world_size = 4;
  int layers = 1;
  int channels = 64;
  int batch = 32;        // values per rank, channel and step
  int steps = 20;        // from step 1
  bool backward = true;  // a BACKWARD round after each FORWARD
  // Each rank sleeps this long after each step (0: none).
  absl::Duration pace = absl::ZeroDuration();
  // This rank's values are shifted by `outlier_shift` standard deviations
  // (its batch mean with them) at every step; -1: none.
  int outlier_rank = -1;
  double outlier_shift = 3;
  int64_t round_timeout_ms = 20000;
  uint64_t seed = 1;
};

// The moments of `n` values per channel drawn from N(shift, 1): count n,
// each channel's mean and M2 of its own draws.
Moments NormalMoments(std::mt19937_64& rng, int channels, int n,
                      double shift = 0);

// Creates the job (one group of world_size, `layers` layers of `channels`)
// and runs its ranks to the last step, one thread and node group each;
// OK, or the first error a rank got, naming the rank and step.
absl::Status RunRankLoad(const RankLoadOptions& options);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_RANK_LOAD_H_
