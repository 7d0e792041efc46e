// Fibers for the emulator's CUDA threads: a stack and a saved context,
// switched by hand (no system call per switch, unlike swapcontext), with
// the AddressSanitizer and ThreadSanitizer fiber annotations.
#ifndef SYNCNORM_KERNELS_EMULATOR_FIBER_H_
#define SYNCNORM_KERNELS_EMULATOR_FIBER_H_

#include <cstddef>

namespace syncnorm::emu {

// A fiber's stack: `bytes` usable bytes above a guard page. Owns the
// mapping.
class FiberStack {
 public:
  explicit FiberStack(size_t bytes);
  ~FiberStack();
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;

  char* bottom() const { return bottom_; }
  size_t bytes() const { return bytes_; }

 private:
  char* mapping_;
  size_t mapping_bytes_;
  char* bottom_;
  size_t bytes_;
};

// The stack bytes a fiber gets.
size_t FiberStackBytes();

// A context to switch to and from. A fiber made by Start runs entry(arg) on
// its stack the first time it is switched to; entry must never return (it
// switches away for good instead).
class Fiber {
 public:
  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber();

  // Prepares this fiber to run entry(arg) on `stack`.
  void Start(FiberStack* stack, void (*entry)(void*), void* arg);

  // Saves the running context into `from` and continues `to`. `from_dies`:
  // `from` will never be switched to again (its stack may be reused).
  static void Switch(Fiber& from, Fiber& to, bool from_dies = false);

  // Called first thing on a fiber after every switch to it.
  void Arrived();

  // Called on `here` after a siglongjmp from another fiber's stack back to
  // here's (a fault in a CUDA thread): the sanitizers learn that the thread
  // runs on here's stack again, and the fiber jumped from dies. Without
  // this, LeakSanitizer would scan the dead fiber's stack as the thread's.
  static void LandedByJump(Fiber& here);

 private:
  void* sp_ = nullptr;
  // Where this fiber's stack is, for the sanitizers: null for the thread's
  // own stack until it is learnt on the first switch away.
  const void* stack_bottom_ = nullptr;
  size_t stack_bytes_ = 0;
  void* asan_fake_stack_ = nullptr;
  // Used only under ThreadSanitizer.
  [[maybe_unused]] void* tsan_fiber_ = nullptr;
  [[maybe_unused]] bool tsan_owned_ = false;
  Fiber* from_ = nullptr;  // who switched to this fiber last
};

}  // namespace syncnorm::emu

#endif  // SYNCNORM_KERNELS_EMULATOR_FIBER_H_
