#include "server/memory_trimmer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace syncnorm {

MemoryTrimmer::MemoryTrimmer(absl::Duration period)
    : period_(period), thread_([this] { Loop(); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MemoryTrimmer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) {
    mu_.Unlock();
#if defined(__GLIBC__)
    // Releases free pages of every arena, not only the top of the main
    // heap; takes each arena's lock briefly.
    malloc_trim(0);
#endif
    mu_.Lock();
  }
}

}  // namespace syncnorm
