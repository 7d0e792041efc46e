// absl::CondVar for ThreadSanitizer when Abseil is not built with it: a
// wait releases the mutex and reacquires it in the mode it was held, as
// Abseil annotates CondVar::WaitCommon under TSan. Signal and SignalAll are
// not interposed: like TSan's own pthread_cond_signal and Abseil's
// annotations, they add no happens-before edge; the waiter is ordered after
// the signaller by the mutex it reacquires.
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/tsan/lock_mode.h"
#include "tests/tsan/real_symbol.h"

using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Time;
using syncnorm::tsan::ReacquiredAfterWait;
using syncnorm::tsan::ReleasedForWait;

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanCondVarWait,
                        "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE",
                        (CondVar * cv, Mutex* mu)) {
  const unsigned flags = ReleasedForWait(mu);
  SyncnormTsanCondVarWaitReal()(cv, mu);
  ReacquiredAfterWait(mu, flags);
}

// Returns true on timeout; the mutex is held again either way.
// WaitWithTimeout is not interposed: Abseil implements it as a call to
// WaitWithDeadline through the PLT, which lands here.
SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanCondVarWaitWithDeadline,
    "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
    (CondVar * cv, Mutex* mu, Time deadline)) {
  const unsigned flags = ReleasedForWait(mu);
  const bool timed_out =
      SyncnormTsanCondVarWaitWithDeadlineReal()(cv, mu, deadline);
  ReacquiredAfterWait(mu, flags);
  return timed_out;
}
