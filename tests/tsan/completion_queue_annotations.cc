// gRPC's completion queues for ThreadSanitizer when libgrpc is not built
// with it (Debian's is not). gRPC promises that a batch's completion comes
// after grpc_call_start_batch started it; inside libgrpc that order runs
// through atomics TSan cannot see, so the code that fills a batch's
// operations on one thread (inline grpcpp code in our binaries) and the code
// that finalizes them on the thread the completion is delivered to would
// be reported. The start releases on the batch's tag; taking the tag's
// completion from the queue acquires it. Callback-API completions arrive the
// same way: where the poller is not a background one (Debian's), libgrpc++
// runs callback functors from threads that call grpc_completion_queue_next.
#include <grpc/grpc.h>
#include <sanitizer/tsan_interface.h>

#include "tests/tsan/real_symbol.h"

using syncnorm::tsan::RealSymbol;

extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call,
                                                 const grpc_op* ops,
                                                 size_t nops, void* tag,
                                                 void* reserved) {
  static const auto real =
      RealSymbol("grpc_call_start_batch", &grpc_call_start_batch);
  __tsan_release(tag);
  return real(call, ops, nops, tag, reserved);
}

extern "C" grpc_event grpc_completion_queue_next(grpc_completion_queue* cq,
                                                 gpr_timespec deadline,
                                                 void* reserved) {
  static const auto real =
      RealSymbol("grpc_completion_queue_next", &grpc_completion_queue_next);
  const grpc_event event = real(cq, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) __tsan_acquire(event.tag);
  return event;
}

extern "C" grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq,
                                                  void* tag,
                                                  gpr_timespec deadline,
                                                  void* reserved) {
  static const auto real =
      RealSymbol("grpc_completion_queue_pluck", &grpc_completion_queue_pluck);
  const grpc_event event = real(cq, tag, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) __tsan_acquire(event.tag);
  return event;
}
