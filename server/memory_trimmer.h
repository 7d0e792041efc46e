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
// the process holds more than its working set needs. Over the last kWindow
// periods:
//
//   set    = the least, over those periods, of each one's most heap in use
//   beyond = the least resident memory beyond the heap in use at a sample
//            (code, mappings, what the heap keeps at its least)
//   trim  <=> resident > beyond + 5/4 * set
//
// `set` is the heap in use that recurs. A wide job's rounds allocate their
// payloads and free them when they end, over and over (128 MiB a round at
// 4096 ranks of 2048 channels), in every period of a training step;
// trimming that between two rounds gives back what the next one faults in
// again, page by page (an earlier build took 11 minor faults per
// contribution there). A burst (a flood, a one-off large message) is in
// use in some periods, not all: what it leaves is trimmed at the end of
// the period it ends in, or of the next one if it was still in use then. Heap
// that a trim cannot give back (at an arena's top, below M_TRIM_THRESHOLD)
// becomes part of `beyond` once the burst's samples have left the window, so it
// is not trimmed again and again. Until kWindow periods have passed, and for
// kWindow periods after Forget(), no heap counts as the working set. Not
// thread-safe.
class TrimPolicy {
 public:
  static constexpr int kSamples = 10;  // a period's samples
  static constexpr int kWindow = 3;

  // A sample, in bytes. Every kSamples-th sample ends a period; returns
  // true when it does and the rule above says to trim then.
  bool Sample(int64_t resident, int64_t in_use);

  // Drops the heap the last kWindow periods had in use from the working
  // set: it belonged to connections the server has closed.
  void Forget();

 private:
  struct Period {
    int64_t most_in_use = -1;  // -1 before the first sample; 0 forgotten
    int64_t least_beyond = INT64_MAX;
  };
  int samples_ = 0;
  // The last kWindow periods, the current one at index period_ % kWindow.
  std::array<Period, kWindow> periods_{};
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

  // The server closed a connection (a flood): what it held is no working
  // set, however often such floods came. Applied at the next sample.
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
