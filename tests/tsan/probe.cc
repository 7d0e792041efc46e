// A counter guarded by absl::Mutex (line 13) and, with an argument, a
// racing write to another one from a thread that takes no lock (line 17):
// the ThreadSanitizer probe of probe.sh.
#include <thread>

#include "absl/synchronization/mutex.h"

absl::Mutex mu;
long guarded = 0;
long unguarded = 0;

void Locked() {
  for (int i = 0; i < 100000; ++i) { absl::MutexLock l(&mu); ++guarded; }
}

void Racy() {
  for (int i = 0; i < 100000; ++i) ++unguarded;  // the injected race
}

int main(int argc, char**) {
  std::thread a(Locked), b(Locked);
  std::thread c(argc > 1 ? Racy : Locked), d(argc > 1 ? Racy : Locked);
  a.join(); b.join(); c.join(); d.join();
  return 0;
}
