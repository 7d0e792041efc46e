// The mode in which this thread holds an absl::Mutex, for annotating the
// calls that release a held mutex and reacquire it in the same mode
// (Mutex::Await*, CondVar::Wait*). Abseil decides that mode from the mutex
// word; the annotations keep their own record instead: every shared-mode
// acquisition and release goes through them.
#ifndef SYNCNORM_TESTS_TSAN_LOCK_MODE_H_
#define SYNCNORM_TESTS_TSAN_LOCK_MODE_H_

namespace syncnorm::tsan {

// Records that this thread now holds `mu` in shared mode.
void NoteReaderLocked(const void* mu);
// Records that this thread released its shared hold of `mu`.
void NoteReaderUnlocked(const void* mu);
// __tsan_mutex_read_lock if this thread holds `mu` in shared mode, else 0.
unsigned HeldModeFlags(const void* mu);

// Tells TSan that the held `mu` is released (a happens-before edge to its
// next acquirer) and that the thread starts reacquiring it. REQUIRES: the
// thread holds `mu`; ReacquiredAfterWait(mu, flags) follows once it is
// held again. Returns the flags to pass on.
unsigned ReleasedForWait(void* mu);
void ReacquiredAfterWait(void* mu, unsigned flags);

}  // namespace syncnorm::tsan

#endif  // SYNCNORM_TESTS_TSAN_LOCK_MODE_H_
