// Annotates absl::Mutex::Lock/Unlock for TSan when Abseil itself is not
// instrumented (Debian's is not): linked with ld --wrap=<mangled name>, our
// calls reach these wrappers, which tell TSan about the lock and unlock.
// Symbols are Debian's (inline namespace debian3). See probe.sh.
#include <sanitizer/tsan_interface.h>
#include "absl/synchronization/mutex.h"
extern "C" {
void __real__ZN4absl7debian35Mutex4LockEv(absl::Mutex*);
void __real__ZN4absl7debian35Mutex6UnlockEv(absl::Mutex*);
void __wrap__ZN4absl7debian35Mutex4LockEv(absl::Mutex* m) {
  __tsan_mutex_pre_lock(m, 0);
  __real__ZN4absl7debian35Mutex4LockEv(m);
  __tsan_mutex_post_lock(m, 0, 0);
}
void __wrap__ZN4absl7debian35Mutex6UnlockEv(absl::Mutex* m) {
  __tsan_mutex_pre_unlock(m, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(m);
  __tsan_mutex_post_unlock(m, 0);
}
}
