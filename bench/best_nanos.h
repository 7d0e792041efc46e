// Timing for the same-process micro-benchmarks (bench-crc32c,
// bench-fingerprint): the best of several passes, so that a pass the
// machine interrupted does not count.
#ifndef SYNCNORM_BENCH_BEST_NANOS_H_
#define SYNCNORM_BENCH_BEST_NANOS_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace syncnorm::bench {

// The fewest nanoseconds per call over `reps` passes of `calls` calls of
// `f(sink)`, where sink is the sum of the results so far: each call takes
// the previous one's result, so none can be skipped or hoisted.
template <typename F>
double BestNanosPerCall(F f, int calls, int reps) {
  double best = 1e300;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) sink += f(sink);
    const std::chrono::duration<double, std::nano> dt =
        std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / calls);
  }
  if (sink == 1) std::fprintf(stderr, " ");  // keeps the calls
  return best;
}

}  // namespace syncnorm::bench

#endif  // SYNCNORM_BENCH_BEST_NANOS_H_
