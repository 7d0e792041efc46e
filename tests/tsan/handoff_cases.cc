// Hand-off cases: a consumer waits through one primitive until a producer
// publishes, then reads shared_data. Synced: the producer writes it before
// publishing. Racy: after. Consumers that wait holding the mutex (Await,
// CondVar::Wait, gpr_cv_wait) first write shared_data under it, which the
// producer reads under it: ordered only if the wait's release is seen.
#include <grpc/support/sync.h>
#include <grpc/support/time.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/tsan/cases.h"

namespace syncnorm::tsan {
namespace {

constexpr absl::Duration kPatience = absl::Minutes(1);

struct Handoff {
  Handoff() {
    gpr_mu_init(&gmu);
    gpr_cv_init(&gcv);
  }
  ~Handoff() {
    gpr_cv_destroy(&gcv);
    gpr_mu_destroy(&gmu);
  }

  absl::Mutex mu;
  absl::CondVar cv;
  bool ready ABSL_GUARDED_BY(mu) = false;
  absl::Notification note;
  gpr_mu gmu;
  gpr_cv gcv;
  bool gready = false;  // guarded by gmu
  // Set by the consumer once it is about to wait (holding the mutex if it
  // waits with it held). Relaxed: no happens-before edge for TSan.
  std::atomic<bool> waiting{false};
  // Set by the producer after its last write to shared_data; in the racy
  // form the consumer waits for it before its read, so the race is always
  // reported at that read, while the write is the producer's latest event.
  // (Left to timing, a polling consumer's race went unreported in about 1
  // run of 100.) Relaxed as well.
  std::atomic<bool> written{false};
};

void MarkWaiting(Handoff& h) {
  h.waiting.store(true, std::memory_order_relaxed);
}

// ---- Consumers. ----------------------------------------------------------

void LockWhen(Handoff& h) {
  MarkWaiting(h);
  h.mu.LockWhen(absl::Condition(&h.ready));
  h.mu.Unlock();
}
void LockWhenWithTimeout(Handoff& h) {
  MarkWaiting(h);
  h.mu.LockWhenWithTimeout(absl::Condition(&h.ready), kPatience);
  h.mu.Unlock();
}
void LockWhenWithDeadline(Handoff& h) {
  MarkWaiting(h);
  h.mu.LockWhenWithDeadline(absl::Condition(&h.ready), absl::Now() + kPatience);
  h.mu.Unlock();
}
void ReaderLockWhen(Handoff& h) {
  MarkWaiting(h);
  h.mu.ReaderLockWhen(absl::Condition(&h.ready));
  h.mu.ReaderUnlock();
}
void ReaderLockWhenWithTimeout(Handoff& h) {
  MarkWaiting(h);
  h.mu.ReaderLockWhenWithTimeout(absl::Condition(&h.ready), kPatience);
  h.mu.ReaderUnlock();
}
void ReaderLockWhenWithDeadline(Handoff& h) {
  MarkWaiting(h);
  h.mu.ReaderLockWhenWithDeadline(absl::Condition(&h.ready),
                                  absl::Now() + kPatience);
  h.mu.ReaderUnlock();
}

void Await(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  h.mu.Await(absl::Condition(&h.ready));
}
void AwaitWithTimeout(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  h.mu.AwaitWithTimeout(absl::Condition(&h.ready), kPatience);
}
void AwaitWithDeadline(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  h.mu.AwaitWithDeadline(absl::Condition(&h.ready), absl::Now() + kPatience);
}
void ReaderAwait(Handoff& h) {
  absl::ReaderMutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  h.mu.Await(absl::Condition(&h.ready));
}

void CondVarWait(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  while (!h.ready) h.cv.Wait(&h.mu);
}
void CondVarWaitWithTimeout(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  while (!h.ready) h.cv.WaitWithTimeout(&h.mu, kPatience);
}
void CondVarWaitWithDeadline(Handoff& h) {
  absl::MutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  while (!h.ready) h.cv.WaitWithDeadline(&h.mu, absl::Now() + kPatience);
}
void ReaderCondVarWait(Handoff& h) {
  absl::ReaderMutexLock l(&h.mu);
  WriteShared(1);
  MarkWaiting(h);
  while (!h.ready) h.cv.Wait(&h.mu);
}

void NotificationWait(Handoff& h) {
  MarkWaiting(h);
  h.note.WaitForNotification();
}
void NotificationWaitWithTimeout(Handoff& h) {
  MarkWaiting(h);
  while (!h.note.WaitForNotificationWithTimeout(kPatience)) {
  }
}
void NotificationWaitWithDeadline(Handoff& h) {
  MarkWaiting(h);
  while (!h.note.WaitForNotificationWithDeadline(absl::Now() + kPatience)) {
  }
}
void NotificationPoll(Handoff& h) {
  MarkWaiting(h);
  while (!h.note.HasBeenNotified()) std::this_thread::yield();
}

// gpr_cv_wait waits on an absl::CondVar from libgpr.so.
void GprCvWait(Handoff& h) {
  gpr_mu_lock(&h.gmu);
  WriteShared(1);
  MarkWaiting(h);
  while (!h.gready) {
    gpr_cv_wait(&h.gcv, &h.gmu, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  }
  gpr_mu_unlock(&h.gmu);
}

// ---- Producers. The synced write is inside the publishing critical
// section; the racy one after it. -----------------------------------------

void PublishLocked(Handoff& h, bool racy) {
  {
    absl::MutexLock l(&h.mu);
    ReadShared();
    if (!racy) WriteShared(2);
    h.ready = true;
    h.cv.SignalAll();
  }
  if (racy) WriteShared(2);
}

void PublishNotify(Handoff& h, bool racy) {
  if (!racy) WriteShared(2);
  h.note.Notify();
  if (racy) WriteShared(2);
}

void PublishGpr(Handoff& h, bool racy) {
  gpr_mu_lock(&h.gmu);
  ReadShared();
  if (!racy) WriteShared(2);
  h.gready = true;
  gpr_cv_broadcast(&h.gcv);
  gpr_mu_unlock(&h.gmu);
  if (racy) WriteShared(2);
}

template <void (*kConsume)(Handoff&), void (*kPublish)(Handoff&, bool)>
void RunHandoff(bool racy) {
  Handoff h;
  std::thread consumer([&] {
    kConsume(h);
    while (racy && !h.written.load(std::memory_order_relaxed)) {
      std::this_thread::yield();
    }
    ReadShared();
  });
  std::thread producer([&] {
    while (!h.waiting.load(std::memory_order_relaxed)) {
      std::this_thread::yield();
    }
    kPublish(h, racy);
    h.written.store(true, std::memory_order_relaxed);
  });
  consumer.join();
  producer.join();
}

}  // namespace

std::vector<Case> HandoffCases() {
  return {
      {"lock_when", RunHandoff<LockWhen, PublishLocked>},
      {"lock_when_with_timeout",
       RunHandoff<LockWhenWithTimeout, PublishLocked>},
      {"lock_when_with_deadline",
       RunHandoff<LockWhenWithDeadline, PublishLocked>},
      {"reader_lock_when", RunHandoff<ReaderLockWhen, PublishLocked>},
      {"reader_lock_when_with_timeout",
       RunHandoff<ReaderLockWhenWithTimeout, PublishLocked>},
      {"reader_lock_when_with_deadline",
       RunHandoff<ReaderLockWhenWithDeadline, PublishLocked>},
      {"await", RunHandoff<Await, PublishLocked>},
      {"await_with_timeout", RunHandoff<AwaitWithTimeout, PublishLocked>},
      {"await_with_deadline", RunHandoff<AwaitWithDeadline, PublishLocked>},
      {"reader_await", RunHandoff<ReaderAwait, PublishLocked>},
      {"condvar_wait", RunHandoff<CondVarWait, PublishLocked>},
      {"condvar_wait_with_timeout",
       RunHandoff<CondVarWaitWithTimeout, PublishLocked>},
      {"condvar_wait_with_deadline",
       RunHandoff<CondVarWaitWithDeadline, PublishLocked>},
      {"reader_condvar_wait", RunHandoff<ReaderCondVarWait, PublishLocked>},
      {"notification_wait", RunHandoff<NotificationWait, PublishNotify>},
      {"notification_wait_with_timeout",
       RunHandoff<NotificationWaitWithTimeout, PublishNotify>},
      {"notification_wait_with_deadline",
       RunHandoff<NotificationWaitWithDeadline, PublishNotify>},
      {"notification_has_been_notified",
       RunHandoff<NotificationPoll, PublishNotify>},
      {"gpr_cv_wait", RunHandoff<GprCvWait, PublishGpr>},
  };
}

}  // namespace syncnorm::tsan
