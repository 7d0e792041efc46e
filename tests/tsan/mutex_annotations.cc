// absl::Mutex for ThreadSanitizer when Abseil is not built with it
// (Debian's is not): each exported Mutex entry point is defined here under
// its mangled name, annotated as Abseil annotates itself under TSan
// (mutex.cc's ABSL_TSAN_MUTEX_* calls), and forwarded to Abseil's own
// definition. The executable's definition interposes the shared library's
// for every caller, gRPC and Abseil included. Inline members
// (WriterLock, ReaderMutexLock...) call these; the constructor is inline
// and annotates itself in instrumented code.
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/tsan/lock_mode.h"
#include "tests/tsan/real_symbol.h"

using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Time;
using syncnorm::tsan::NoteReaderLocked;
using syncnorm::tsan::NoteReaderUnlocked;
using syncnorm::tsan::ReacquiredAfterWait;
using syncnorm::tsan::ReleasedForWait;

// ---- Destruction: forget the mutex, so its address can be reused. --------

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanMutexD1, "_ZN4absl7debian35MutexD1Ev",
                        (Mutex * mu)) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  SyncnormTsanMutexD1Real()(mu);
}

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanMutexD2, "_ZN4absl7debian35MutexD2Ev",
                        (Mutex * mu)) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  SyncnormTsanMutexD2Real()(mu);
}

// ---- Exclusive mode. -----------------------------------------------------

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanLock, "_ZN4absl7debian35Mutex4LockEv",
                        (Mutex * mu)) {
  __tsan_mutex_pre_lock(mu, 0);
  SyncnormTsanLockReal()(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}

SYNCNORM_TSAN_INTERPOSE(bool, SyncnormTsanTryLock,
                        "_ZN4absl7debian35Mutex7TryLockEv", (Mutex * mu)) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = SyncnormTsanTryLockReal()(mu);
  __tsan_mutex_post_lock(
      mu,
      locked ? __tsan_mutex_try_lock
             : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed,
      0);
  return locked;
}

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanUnlock,
                        "_ZN4absl7debian35Mutex6UnlockEv", (Mutex * mu)) {
  __tsan_mutex_pre_unlock(mu, 0);
  SyncnormTsanUnlockReal()(mu);
  __tsan_mutex_post_unlock(mu, 0);
}

// Conditions are evaluated inside the real calls, where TSan ignores
// memory accesses (as it does inside Abseil's own annotated calls): the
// evaluating thread holds the mutex, or is the one releasing it.
SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanLockWhen,
                        "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE",
                        (Mutex * mu, const Condition& cond)) {
  __tsan_mutex_pre_lock(mu, 0);
  SyncnormTsanLockWhenReal()(mu, cond);
  __tsan_mutex_post_lock(mu, 0, 0);
}

// Deadlines return with the mutex held whatever the condition. The
// *WithTimeout variants are not interposed: Abseil implements each as a
// call to its *WithDeadline variant through the PLT, which lands here (an
// annotation of both would count every such lock twice).
SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanLockWhenWithDeadline,
    "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
    (Mutex * mu, const Condition& cond, Time deadline)) {
  __tsan_mutex_pre_lock(mu, 0);
  const bool met = SyncnormTsanLockWhenWithDeadlineReal()(mu, cond, deadline);
  __tsan_mutex_post_lock(mu, 0, 0);
  return met;
}

// ---- Shared mode: also recorded, for Await and CondVar::Wait. ------------

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanReaderLock,
                        "_ZN4absl7debian35Mutex10ReaderLockEv", (Mutex * mu)) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  SyncnormTsanReaderLockReal()(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
  NoteReaderLocked(mu);
}

SYNCNORM_TSAN_INTERPOSE(bool, SyncnormTsanReaderTryLock,
                        "_ZN4absl7debian35Mutex13ReaderTryLockEv",
                        (Mutex * mu)) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_read_lock);
  const bool locked = SyncnormTsanReaderTryLockReal()(mu);
  __tsan_mutex_post_lock(
      mu,
      locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed,
      0);
  if (locked) NoteReaderLocked(mu);
  return locked;
}

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanReaderUnlock,
                        "_ZN4absl7debian35Mutex12ReaderUnlockEv",
                        (Mutex * mu)) {
  NoteReaderUnlocked(mu);
  __tsan_mutex_pre_unlock(mu, __tsan_mutex_read_lock);
  SyncnormTsanReaderUnlockReal()(mu);
  __tsan_mutex_post_unlock(mu, __tsan_mutex_read_lock);
}

SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanReaderLockWhen,
    "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE",
    (Mutex * mu, const Condition& cond)) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  SyncnormTsanReaderLockWhenReal()(mu, cond);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
  NoteReaderLocked(mu);
}

SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanReaderLockWhenWithDeadline,
    "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_"
    "4TimeE",
    (Mutex * mu, const Condition& cond, Time deadline)) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  const bool met =
      SyncnormTsanReaderLockWhenWithDeadlineReal()(mu, cond, deadline);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
  NoteReaderLocked(mu);
  return met;
}

// ---- Await: release, wait for the condition, reacquire in the held mode. --

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanAwait,
                        "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE",
                        (Mutex * mu, const Condition& cond)) {
  const unsigned flags = ReleasedForWait(mu);
  SyncnormTsanAwaitReal()(mu, cond);
  ReacquiredAfterWait(mu, flags);
}

SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanAwaitWithDeadline,
    "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
    (Mutex * mu, const Condition& cond, Time deadline)) {
  const unsigned flags = ReleasedForWait(mu);
  const bool met = SyncnormTsanAwaitWithDeadlineReal()(mu, cond, deadline);
  ReacquiredAfterWait(mu, flags);
  return met;
}
