// Gives the heap that a burst freed back to the kernel.
#ifndef SYNCNORM_SERVER_MEMORY_TRIMMER_H_
#define SYNCNORM_SERVER_MEMORY_TRIMMER_H_

#include <array>
#include <cstdint>

#include "absl/time/time.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

// Calls glibc's malloc_trim(0) when the heap holds more free memory than
// the server has recently had in use, on a thread of its own. glibc serves
// allocations below its mmap threshold (adaptive, up to 32 MiB: every
// message of a server with a smaller --max_message_bytes) from its
// per-thread arenas and keeps what is freed there mapped, so without this
// a server's resident memory stays near its peak long after a burst of
// large messages, from abusive clients or not, is over. What it cannot
// reach: the free space at the top of each thread's arena, which glibc
// gives back only once it is M_TRIM_THRESHOLD (server/main.cc) or more.
//
// Why not every period: a wide job's rounds allocate their payloads and
// free them when they end, over and over (128 MiB a round at 4096 ranks of
// 2048 channels). Trimming that between two rounds gives back what the
// next one faults in again, page by page (an earlier build took 11 minor
// faults per contribution there). So the trimmer samples the heap in use
// every period / kSamples and trims at the end of a period only when the
// free heap is larger than the most in use at any sample of the last
// kWindow periods: memory a burst left, not the working set. A burst's
// leftover therefore goes back within kWindow + 1 periods of its end.
//
// A no-op without glibc. Thread-safe; the destructor stops and joins the
// thread.
class MemoryTrimmer {
 public:
  static constexpr int kSamples = 10;
  static constexpr int kWindow = 6;

  // REQUIRES: period > 0.
  explicit MemoryTrimmer(absl::Duration period);
  ~MemoryTrimmer();

  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

 private:
  // Samples the heap; at every kSamples-th call, trims if it should. Only
  // the thread calls it.
  void Tick();

  // Touched by the thread only.
  int ticks_ = 0;
  // The most heap in use at a sample of each of the last kWindow periods
  // (the current one at index period_ % kWindow).
  std::array<int64_t, kWindow> peaks_{};
  int64_t period_ = 0;

  PeriodicThread thread_;  // last: starts once the rest is built
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_MEMORY_TRIMMER_H_
