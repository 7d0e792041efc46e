// absl::Notification for ThreadSanitizer when Abseil is not built with it:
// Notify() releases and a wait that saw the notification acquires, on the
// address of the flag that the inline HasBeenNotified() acquire-loads in
// instrumented code, so that check is ordered after Notify() too. (The
// internal mutex's lock and unlock are annotated as well, but a wait that
// finds the flag already set takes no lock.)
#include <sanitizer/tsan_interface.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/tsan/real_symbol.h"

using absl::Duration;
using absl::Notification;
using absl::Time;

namespace {

// &n->notified_yet_, a private member: named through an explicit
// instantiation, where access checking does not apply
// ([temp.explicit]/12 in C++17).
void* FlagOf(const Notification* n);

template <std::atomic<bool> Notification::*kFlag>
struct FlagAccess {
  friend void* FlagOf(const Notification* n) {
    return const_cast<std::atomic<bool>*>(&(n->*kFlag));
  }
};
template struct FlagAccess<&Notification::notified_yet_>;

}  // namespace

SYNCNORM_TSAN_INTERPOSE(void, SyncnormTsanNotify,
                        "_ZN4absl7debian312Notification6NotifyEv",
                        (Notification * n)) {
  __tsan_release(FlagOf(n));
  SyncnormTsanNotifyReal()(n);
}

SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanWaitForNotification,
    "_ZNK4absl7debian312Notification19WaitForNotificationEv",
    (const Notification* n)) {
  SyncnormTsanWaitForNotificationReal()(n);
  __tsan_acquire(FlagOf(n));
}

// Returns whether notified; only then is there an edge from Notify().
SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanWaitForNotificationWithTimeout,
    "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_"
    "8DurationE",
    (const Notification* n, Duration timeout)) {
  const bool notified =
      SyncnormTsanWaitForNotificationWithTimeoutReal()(n, timeout);
  if (notified) __tsan_acquire(FlagOf(n));
  return notified;
}

SYNCNORM_TSAN_INTERPOSE(
    bool, SyncnormTsanWaitForNotificationWithDeadline,
    "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_"
    "4TimeE",
    (const Notification* n, Time deadline)) {
  const bool notified =
      SyncnormTsanWaitForNotificationWithDeadlineReal()(n, deadline);
  if (notified) __tsan_acquire(FlagOf(n));
  return notified;
}
