// The lifetime of the service's reactors: each deletes itself once gRPC is
// done with it and every aggregator callback it issued has fired.
#ifndef SYNCNORM_SERVER_RPC_REF_COUNTED_REACTOR_H_
#define SYNCNORM_SERVER_RPC_REF_COUNTED_REACTOR_H_

#include <atomic>
#include <utility>

namespace syncnorm {

// A reactor (`Base`: BidiReactor or UnaryReactor, async_call.h) with a
// reference count: gRPC holds one until OnDone, and each aggregator
// callback in flight, each OnCancel while it runs (see
// ReduceReactor::OnCancel) and each other holder one more. The last Unref()
// deletes the reactor. Thread-safe.
template <typename Base>
class RefCountedReactor : public Base {
 public:
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 protected:
  // `refs`: the references it starts with, gRPC's included; `args` are
  // Base's.
  template <typename... Args>
  explicit RefCountedReactor(int refs, Args&&... args)
      : Base(std::forward<Args>(args)...), refs_(refs) {}
  ~RefCountedReactor() override = default;

 private:
  std::atomic<int> refs_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REF_COUNTED_REACTOR_H_
