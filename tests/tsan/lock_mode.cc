#include "tests/tsan/lock_mode.h"

#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

namespace syncnorm::tsan {
namespace {

// Shared holds of this thread, in no order. Trivially destructible, so
// it is usable from any thread at any point of its life. A thread holding
// more reader locks at once than this is not something our tests or gRPC
// do; the process stops rather than annotate a wrong mode.
constexpr int kMaxReaderHolds = 64;
thread_local const void* reader_holds[kMaxReaderHolds];
thread_local int reader_hold_count = 0;

}  // namespace

void NoteReaderLocked(const void* mu) {
  if (reader_hold_count == kMaxReaderHolds) {
    std::fputs("tests/tsan: too many reader locks held by one thread\n",
               stderr);
    std::abort();
  }
  reader_holds[reader_hold_count++] = mu;
}

void NoteReaderUnlocked(const void* mu) {
  for (int i = reader_hold_count - 1; i >= 0; --i) {
    if (reader_holds[i] != mu) continue;
    reader_holds[i] = reader_holds[--reader_hold_count];
    return;
  }
}

unsigned HeldModeFlags(const void* mu) {
  for (int i = 0; i < reader_hold_count; ++i) {
    if (reader_holds[i] == mu) return __tsan_mutex_read_lock;
  }
  return 0;
}

// Abseil's own annotations (built with TSan) bracket the same calls this
// way: the unlock is complete before the wait, the lock is pending until
// the mutex is held again.
unsigned ReleasedForWait(void* mu) {
  const unsigned flags = HeldModeFlags(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  return flags;
}

void ReacquiredAfterWait(void* mu, unsigned flags) {
  __tsan_mutex_post_lock(mu, flags, 0);
}

}  // namespace syncnorm::tsan
