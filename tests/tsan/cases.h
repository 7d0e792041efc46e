// The cases of annotations_test.sh: each runs threads that synchronize
// through one primitive, and in its racy form also touches `shared_data`
// where the primitive does not order it. With the annotations, TSan
// reports nothing for the synced form and a data race on `shared_data` for
// the racy one.
#ifndef SYNCNORM_TESTS_TSAN_CASES_H_
#define SYNCNORM_TESTS_TSAN_CASES_H_

#include <vector>

namespace syncnorm::tsan {

struct Case {
  const char* name;
  void (*run)(bool racy);
};

// Mutual exclusion: Lock, ReaderLock, TryLock, ReaderTryLock, gpr_mu.
std::vector<Case> ExclusionCases();
// Hand-offs: LockWhen*, ReaderLockWhen*, Await*, CondVar::Wait*,
// Notification, gpr_cv.
std::vector<Case> HandoffCases();
// gRPC's hand-off of a callback-API call from the thread that accepts it
// to the one that runs it.
std::vector<Case> CallbackRequestCases();

// The data the cases race on (or not), behind calls that stay in the
// report's stacks.
void WriteShared(int v);
int ReadShared();

}  // namespace syncnorm::tsan

#endif  // SYNCNORM_TESTS_TSAN_CASES_H_
