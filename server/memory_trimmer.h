// Gives the heap that a burst freed back to the kernel.
#ifndef SYNCNORM_SERVER_MEMORY_TRIMMER_H_
#define SYNCNORM_SERVER_MEMORY_TRIMMER_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

// When to trim, apart from glibc: fed samples of the process's resident
// memory and of its heap in use, says at the end of each period whether
// the process holds more than its working set needs:
//
//   set    = the most heap in use at a sample of the last kWindow periods
//   beyond = the least resident memory beyond the heap in use at a sample
//            of the last 2 kWindow periods (code, mappings, what the heap
//            keeps at its least)
//   trim  <=> resident > beyond + 5/4 * set
//
// A wide job's rounds allocate their payloads and free them when they
// end, over and over (128 MiB a round at 4096 ranks of 2048 channels, a
// round every few seconds on two cores); trimming that between two rounds
// gives back what the next one faults in again, page by page (an earlier
// build took 11 minor faults per contribution there). So heap in use at
// any sample of the window is kept, and what a one-off burst leaves goes
// back once the burst has left the window. A flood is no working set: when
// the server closes a connection for abuse, Forget() drops the heap in use
// so far, and the samples of the next kForgetPeriods periods, while gRPC
// frees what the connection's calls held; what the flood left goes back at
// the end of the period. Heap that a trim cannot give back (at an arena's
// top, below M_TRIM_THRESHOLD) counts as held beyond once the burst has
// left the longer window, so it is not trimmed again and again. Resident
// memory, not glibc's count of its free heap: heap that malloc_trim gave
// back stays free heap to glibc, and would look like a leftover forever.
// Not thread-safe.
class TrimPolicy {
 public:
  static constexpr int kSamples = 10;  // a period's samples
  static constexpr int kWindow = 6;
  static constexpr int kForgetPeriods = 2;

  // A sample, in bytes. Every kSamples-th sample ends a period; returns
  // true when it does and the rule above says to trim then.
  bool Sample(int64_t resident, int64_t in_use);

  // The server closed a connection for abuse: see above.
  void Forget();

 private:
  struct Period {
    int64_t most_in_use = 0;
    int64_t least_beyond = INT64_MAX;  // INT64_MAX: no sample yet
  };
  int samples_ = 0;
  // Periods whose heap in use is not recorded, the current one included.
  int forgetting_ = 0;
  // The last 2 kWindow periods, the current one at index period_ % size.
  std::array<Period, 2 * kWindow> periods_{};
  int64_t period_ = 0;
};

// Calls glibc's malloc_trim(0) when TrimPolicy says so, sampling the
// resident memory (/proc/self/statm) and the heap in use (mallinfo2: every
// arena's, each arena's lock taken briefly) kSamples times a period on a
// thread of its own. glibc serves
// allocations below its mmap threshold (adaptive, up to 32 MiB: every
// message of a server with a smaller --max_message_bytes) from its
// per-thread arenas and keeps what is freed there mapped, so without this
// a server's resident memory stays near its peak long after a burst of
// large messages, from abusive clients or not, is over. What it cannot
// reach: the free space at the top of each thread's arena, which glibc
// gives back only once it is M_TRIM_THRESHOLD (server/main.cc) or more.
//
// A no-op without glibc. Thread-safe; the destructor stops and joins the
// thread.
class MemoryTrimmer {
 public:
  // REQUIRES: period > 0.
  explicit MemoryTrimmer(absl::Duration period);
  ~MemoryTrimmer();

  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // The server closed a connection for abuse (a flood): what it held is no
  // working set (TrimPolicy::Forget), however often such floods came.
  // Applied at the next sample.
  void ConnectionClosed() { forget_.store(true, std::memory_order_relaxed); }

 private:
  // Samples the heap, and trims if the policy says so. Only the thread
  // calls it.
  void Tick();

  std::atomic<bool> forget_{false};
  TrimPolicy policy_;  // the thread's only

  PeriodicThread thread_;  // last: starts once the rest is built
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_MEMORY_TRIMMER_H_
