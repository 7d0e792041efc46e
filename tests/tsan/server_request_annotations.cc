// A callback-API call handed from the thread that accepts it to the thread
// that runs it, for ThreadSanitizer when libgrpc is not built with it
// (Debian's is not). The accepting thread builds the call's request
// object, context and interceptor batch (libgrpc++ inline code compiled
// into our binaries too, so instrumented) and publishes it with
// grpc_cq_end_op on the server's callback completion queue; another thread
// runs its tag's functor, StaticRun, which starts the interceptors and the
// handler. libgrpc orders the two through atomics TSan cannot see, so the
// interceptors' first look at that batch (Proceed) would be reported
// against its construction. The publication releases on the tag; the
// functor acquires it.
#include <grpc/grpc.h>
#include <sanitizer/tsan_interface.h>

#include "tests/tsan/real_symbol.h"

// grpc_cq_end_op(grpc_completion_queue*, void* tag, absl::Status,
// void (*done)(void*, grpc_cq_completion*), void* done_arg,
// grpc_cq_completion* storage, bool internal): exported from libgrpc,
// which calls it through its PLT. absl::Status is passed as its one
// pointer-sized word (a non-trivial class goes by reference in the ABI).
struct grpc_cq_completion;
SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanCqEndOp,
    "_Z14grpc_cq_end_opP21grpc_completion_queuePvN4absl7debian36StatusEPFvS1_"
    "P18grpc_cq_completionES1_S6_b",
    (grpc_completion_queue * cq, void* tag, void* status,
     void (*done)(void*, grpc_cq_completion*), void* done_arg,
     grpc_cq_completion* storage, bool internal)) {
  __tsan_release(tag);
  SyncnormTsanCqEndOpReal()(cq, tag, status, done, done_arg, storage, internal);
}

// Server::CallbackRequest<Context>::CallbackCallTag::StaticRun(
// grpc_completion_queue_functor* cb, int ok), for both kinds of context;
// libgrpc++ takes its address through its GOT.
SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanCallbackRequestRun,
    "_ZN4grpc6Server15CallbackRequestINS_21CallbackServerContextEE15Callback"
    "CallTag9StaticRunEP29grpc_completion_queue_functori",
    (grpc_completion_queue_functor * cb, int ok)) {
  __tsan_acquire(cb);
  SyncnormTsanCallbackRequestRunReal()(cb, ok);
}

SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanGenericCallbackRequestRun,
    "_ZN4grpc6Server15CallbackRequestINS_28GenericCallbackServerContextEE15"
    "CallbackCallTag9StaticRunEP29grpc_completion_queue_functori",
    (grpc_completion_queue_functor * cb, int ok)) {
  __tsan_acquire(cb);
  SyncnormTsanGenericCallbackRequestRunReal()(cb, ok);
}
