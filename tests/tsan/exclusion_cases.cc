// Mutual exclusion cases. Synced: every access to shared_data is inside
// the mutex (a write in exclusive mode, a read in shared mode). Racy: an
// access that the mutex does not order against the other thread's: one
// outside it, writes in shared mode, or one after a TryLock that failed
// while the mutex still carried the other write's release.
#include <grpc/support/sync.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "tests/tsan/cases.h"

namespace syncnorm::tsan {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

// Waits until `stage` reaches `at_least`. Relaxed: orders the threads in
// time without telling TSan of any happens-before edge.
void AwaitStage(const std::atomic<int>& stage, int at_least) {
  while (stage.load(kRelaxed) < at_least) std::this_thread::yield();
}

void Lock(bool racy) {
  absl::Mutex mu;
  auto locked_write = [&](int v) {
    absl::MutexLock l(&mu);
    WriteShared(v);
  };
  std::thread a(locked_write, 1);
  std::thread b([&] {
    if (racy) {
      WriteShared(2);
    } else {
      locked_write(2);
    }
  });
  a.join();
  b.join();
}

void ReaderLock(bool racy) {
  absl::Mutex mu;
  std::thread a([&] {
    if (racy) {
      absl::ReaderMutexLock l(&mu);
      WriteShared(1);
    } else {
      absl::MutexLock l(&mu);
      WriteShared(1);
    }
  });
  std::thread b([&] {
    absl::ReaderMutexLock l(&mu);
    if (racy) {
      WriteShared(2);
    } else {
      ReadShared();
    }
  });
  a.join();
  b.join();
}

// Racy: a writes under mu; c then holds mu; b's TryLock fails and b writes.
// Had the failed TryLock been annotated as an acquisition, b would inherit
// a's release and the race would go unreported.
void TryLock(bool racy) {
  absl::Mutex mu;
  std::atomic<int> stage{0};
  std::thread a([&] {
    {
      absl::MutexLock l(&mu);
      WriteShared(1);
    }
    stage.store(1, kRelaxed);
  });
  std::thread b([&] {
    if (!racy) {
      while (!mu.TryLock()) std::this_thread::yield();
      WriteShared(2);
      mu.Unlock();
      return;
    }
    AwaitStage(stage, 2);
    if (mu.TryLock()) {
      mu.Unlock();  // cannot happen: c holds mu; the race then goes missing
    } else {
      WriteShared(2);
    }
    stage.store(3, kRelaxed);
  });
  if (racy) {
    AwaitStage(stage, 1);
    absl::MutexLock l(&mu);
    stage.store(2, kRelaxed);
    AwaitStage(stage, 3);
  }
  a.join();
  b.join();
}

void ReaderTryLock(bool racy) {
  absl::Mutex mu;
  auto reader = [&](int v) {
    while (!mu.ReaderTryLock()) std::this_thread::yield();
    if (racy) {
      WriteShared(v);
    } else {
      ReadShared();
    }
    mu.ReaderUnlock();
  };
  std::thread a([&] {
    if (racy) return reader(1);
    absl::MutexLock l(&mu);
    WriteShared(1);
  });
  std::thread b(reader, 2);
  a.join();
  b.join();
}

// gRPC's gpr_mu is an absl::Mutex locked from libgpr.so: its calls reach
// the annotations only through interposition.
void GprMu(bool racy) {
  gpr_mu mu;
  gpr_mu_init(&mu);
  auto locked_write = [&](int v) {
    gpr_mu_lock(&mu);
    WriteShared(v);
    gpr_mu_unlock(&mu);
  };
  std::thread a(locked_write, 1);
  std::thread b([&] {
    if (racy) {
      WriteShared(2);
    } else {
      locked_write(2);
    }
  });
  a.join();
  b.join();
  gpr_mu_destroy(&mu);
}

}  // namespace

std::vector<Case> ExclusionCases() {
  return {
      {"lock", Lock},        {"reader_lock", ReaderLock},
      {"try_lock", TryLock}, {"reader_try_lock", ReaderTryLock},
      {"gpr_mu", GprMu},
  };
}

}  // namespace syncnorm::tsan
