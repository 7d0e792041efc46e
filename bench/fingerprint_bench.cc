// The fingerprint every contribution gets as it joins a round
// (server/domain/contribution.h), kHalfWordLanes, the kind this build
// writes, against kWordLanes, the kind before it, over the same forward
// payload (count, mean and m2 of C channels), timed in the same process.
// Prints, per channel count:
//   FP <channels> <half-word lanes ns> <word lanes ns>
// (best of --reps passes, each over enough calls for ~1 ms).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/best_nanos.h"
#include "server/domain/contribution.h"

ABSL_FLAG(int, reps, 15, "timed passes per size; the best counts");

namespace {

double BestNanos(const syncnorm::Payload& payload,
                 syncnorm::FingerprintKind kind, int channels, int reps) {
  return syncnorm::bench::BestNanosPerCall(
      [&](uint64_t) { return syncnorm::PayloadFingerprint(payload, kind); },
      std::max(1, (1 << 17) / channels), reps);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::mt19937_64 rng(20261203);
  std::normal_distribution<double> normal(0, 1);
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int channels : {256, 2048, 8192}) {
    syncnorm::Moments m;
    m.count = 4096;
    m.mean.resize(channels);
    m.m2.resize(channels);
    for (int c = 0; c < channels; ++c) {
      m.mean[c] = normal(rng);
      m.m2[c] = std::abs(normal(rng)) * m.count;
    }
    const syncnorm::Payload payload = m;
    std::printf("FP %d %.1f %.1f\n", channels,
                BestNanos(payload, syncnorm::FingerprintKind::kHalfWordLanes,
                          channels, reps),
                BestNanos(payload, syncnorm::FingerprintKind::kWordLanes,
                          channels, reps));
  }
  return 0;
}
