// gRPC's callback server API for ThreadSanitizer when libgrpc++ is not
// built with it (Debian's is not). ServerCallbackCall counts the
// conditions for OnCancel and for OnDone in two atomics that it decrements
// acq_rel from inline code, compiled twice: into our binaries
// (instrumented; TSan sees the release and the acquire) and into
// libgrpc++ (not: e.g. the executor closure that runs OnCancel, or the
// CompletionOp). The decrement that reaches zero calls CallOnCancel or
// ScheduleOnDone, exported from libgrpc++ and reached through the PLT from
// either copy, so they are interposed here to acquire what the atomic
// carries, as the uninstrumented decrement would have shown TSan. (A
// decrement in libgrpc++ that does not reach zero releases nothing TSan
// saw it write: that copy of the code is not instrumented. Our reactors'
// OnCancel, which runs just before one, orders itself by their own
// reference count; see server/rpc/reduce_reactor.cc.)
#include <sanitizer/tsan_interface.h>

#include <atomic>

#include "grpcpp/support/server_callback.h"
#include "tests/tsan/real_symbol.h"

using grpc::internal::ServerCallbackCall;
using grpc::internal::ServerReactor;

namespace {

// &ServerCallbackCall's private counters, named through explicit
// instantiations, where access checking does not apply ([temp.explicit]/12
// in C++17).
void* OnCancelConditions(ServerCallbackCall* call);
void* CallbacksOutstanding(ServerCallbackCall* call);

template <std::atomic_int ServerCallbackCall::*kCounter>
struct OnCancelConditionsAccess {
  friend void* OnCancelConditions(ServerCallbackCall* call) {
    return &(call->*kCounter);
  }
};
template struct OnCancelConditionsAccess<
    &ServerCallbackCall::on_cancel_conditions_remaining_>;

template <std::atomic_int ServerCallbackCall::*kCounter>
struct CallbacksOutstandingAccess {
  friend void* CallbacksOutstanding(ServerCallbackCall* call) {
    return &(call->*kCounter);
  }
};
template struct CallbacksOutstandingAccess<
    &ServerCallbackCall::callbacks_outstanding_>;

}  // namespace

SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanCallOnCancel,
    "_ZN4grpc8internal18ServerCallbackCall12CallOnCancelEPNS0_13ServerReactorE",
    (ServerCallbackCall * call, ServerReactor* reactor)) {
  __tsan_acquire(OnCancelConditions(call));
  SyncnormTsanCallOnCancelReal()(call, reactor);
}

SYNCNORM_TSAN_INTERPOSE(
    void, SyncnormTsanScheduleOnDone,
    "_ZN4grpc8internal18ServerCallbackCall14ScheduleOnDoneEb",
    (ServerCallbackCall * call, bool inline_ondone)) {
  __tsan_acquire(CallbacksOutstanding(call));
  SyncnormTsanScheduleOnDoneReal()(call, inline_ondone);
}
