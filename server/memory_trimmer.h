// Gives the heap that a burst freed back to the kernel.
#ifndef SYNCNORM_SERVER_MEMORY_TRIMMER_H_
#define SYNCNORM_SERVER_MEMORY_TRIMMER_H_

#include "absl/time/time.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

// Calls glibc's malloc_trim(0) every `period` on a thread of its own.
// glibc serves allocations below its mmap threshold (adaptive, up to 32
// MiB: every message of a server with a smaller --max_message_bytes) from
// its per-thread arenas and keeps what is freed there mapped, so without
// this a server's resident memory stays near its peak long after a burst
// of large messages, from abusive clients or not, is over. What it cannot
// reach: the free space at the top of each thread's arena, which glibc
// gives back only once it is M_TRIM_THRESHOLD (server/main.cc) or more.
// A no-op without glibc. Thread-safe; the destructor stops and joins the
// thread.
class MemoryTrimmer {
 public:
  // REQUIRES: period > 0.
  explicit MemoryTrimmer(absl::Duration period);
  ~MemoryTrimmer();

  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

 private:
  static void Trim();

  PeriodicThread thread_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_MEMORY_TRIMMER_H_
