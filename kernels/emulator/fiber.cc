#include "kernels/emulator/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SYNCNORM_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define SYNCNORM_EMU_TSAN 1
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace syncnorm::emu {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "CUDA emulator: %s\n", what);
  std::abort();
}

size_t PageBytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

size_t FiberStackBytes() {
#if defined(SYNCNORM_EMU_ASAN) || defined(SYNCNORM_EMU_TSAN)
  return 512 * 1024;  // instrumented frames are much larger
#else
  return 64 * 1024;
#endif
}

FiberStack::FiberStack(size_t bytes) {
  const size_t page = PageBytes();
  bytes_ = (bytes + page - 1) / page * page;
  mapping_bytes_ = bytes_ + page;
  void* m = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) Die("cannot map a fiber stack");
  mapping_ = static_cast<char*>(m);
  // The guard page below the stack: an overflow faults.
  if (mprotect(mapping_, page, PROT_NONE) != 0) Die("cannot protect a guard");
  bottom_ = mapping_ + page;
}

FiberStack::~FiberStack() { munmap(mapping_, mapping_bytes_); }

#if defined(__x86_64__)

// syncnorm_emu_swap(save, to): pushes the callee-saved registers and the
// SSE/x87 control words, stores the stack pointer in *save, loads `to` and
// pops the same from there. syncnorm_emu_start: the first return address of
// a new fiber; calls syncnorm_emu_fiber_main(r12).
extern "C" void syncnorm_emu_swap(void** save, void* to);
extern "C" void syncnorm_emu_start();
asm(R"(
  .text
  .globl syncnorm_emu_swap
  .type syncnorm_emu_swap, @function
syncnorm_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size syncnorm_emu_swap, .-syncnorm_emu_swap

  .globl syncnorm_emu_start
  .type syncnorm_emu_start, @function
syncnorm_emu_start:
  movq %r12, %rdi
  call syncnorm_emu_fiber_main
  ud2
  .size syncnorm_emu_start, .-syncnorm_emu_start
)");

#endif  // __x86_64__

namespace {

// What a new fiber runs: its entry point and argument.
struct StartRecord {
  Fiber* fiber;
  void (*entry)(void*);
  void* arg;
};

}  // namespace

extern "C" void syncnorm_emu_fiber_main(void* record) {
  const StartRecord* r = static_cast<const StartRecord*>(record);
  r->fiber->Arrived();
  r->entry(r->arg);
  Die("a fiber's entry returned");
}

#if defined(__x86_64__)

void Fiber::Start(FiberStack* stack, void (*entry)(void*), void* arg) {
  char* top = stack->bottom() + stack->bytes();
  // The start record sits at the top of the stack, then the frame that
  // syncnorm_emu_swap pops: control words, r15..r12, rbx, rbp, and the
  // return address. sp is 16-byte aligned so that the call in
  // syncnorm_emu_start enters syncnorm_emu_fiber_main as the ABI wants.
  auto* record = reinterpret_cast<StartRecord*>(
      (reinterpret_cast<uintptr_t>(top) - sizeof(StartRecord)) &
      ~uintptr_t{15});
  *record = StartRecord{this, entry, arg};
  auto* sp = reinterpret_cast<uint64_t*>(
      (reinterpret_cast<uintptr_t>(record) - 80) & ~uintptr_t{15});
  const uint32_t mxcsr = 0x1f80;
  const uint16_t fpucw = 0x037f;
  sp[0] = mxcsr | (static_cast<uint64_t>(fpucw) << 32);
  sp[1] = 0;                                   // r15
  sp[2] = 0;                                   // r14
  sp[3] = 0;                                   // r13
  sp[4] = reinterpret_cast<uint64_t>(record);  // r12
  sp[5] = 0;                                   // rbx
  sp[6] = 0;                                   // rbp
  sp[7] = reinterpret_cast<uint64_t>(&syncnorm_emu_start);
  sp_ = sp;
  stack_bottom_ = stack->bottom();
  stack_bytes_ = stack->bytes();
  asan_fake_stack_ = nullptr;
#if defined(SYNCNORM_EMU_ASAN)
  // A reused stack may still carry a dead fiber's red zones.
  __asan_unpoison_memory_region(stack->bottom(), stack->bytes());
#endif
#if defined(SYNCNORM_EMU_TSAN)
  if (tsan_fiber_ == nullptr) {
    tsan_fiber_ = __tsan_create_fiber(0);
    tsan_owned_ = true;
  }
#endif
}

#else  // !__x86_64__: portable, slower (a system call per switch)

namespace {
struct UcontextFiber {
  ucontext_t context;
  StartRecord record;
};
void UcontextEntry(unsigned hi, unsigned lo) {
  const uintptr_t p = (static_cast<uintptr_t>(hi) << 32) | lo;
  syncnorm_emu_fiber_main(&reinterpret_cast<UcontextFiber*>(p)->record);
}
}  // namespace

void Fiber::Start(FiberStack* stack, void (*entry)(void*), void* arg) {
  auto* f = static_cast<UcontextFiber*>(sp_);
  if (f == nullptr) {
    f = new UcontextFiber;
    sp_ = f;
  }
  f->record = StartRecord{this, entry, arg};
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = stack->bottom();
  f->context.uc_stack.ss_size = stack->bytes();
  f->context.uc_link = nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->context, reinterpret_cast<void (*)()>(&UcontextEntry), 2,
              static_cast<unsigned>(p >> 32), static_cast<unsigned>(p));
  stack_bottom_ = stack->bottom();
  stack_bytes_ = stack->bytes();
}

#endif

Fiber::~Fiber() {
#if defined(SYNCNORM_EMU_TSAN)
  if (tsan_owned_) __tsan_destroy_fiber(tsan_fiber_);
#endif
#if !defined(__x86_64__)
  delete static_cast<UcontextFiber*>(sp_);
#endif
}

void Fiber::Switch(Fiber& from, Fiber& to, bool from_dies) {
  to.from_ = &from;
#if defined(SYNCNORM_EMU_TSAN)
  if (from.tsan_fiber_ == nullptr)
    from.tsan_fiber_ = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(to.tsan_fiber_, 0);
#endif
#if defined(SYNCNORM_EMU_ASAN)
  __sanitizer_start_switch_fiber(from_dies ? nullptr : &from.asan_fake_stack_,
                                 to.stack_bottom_, to.stack_bytes_);
#else
  (void)from_dies;
#endif
#if defined(__x86_64__)
  syncnorm_emu_swap(&from.sp_, to.sp_);
#else
  if (from.sp_ == nullptr) from.sp_ = new UcontextFiber;
  swapcontext(&static_cast<UcontextFiber*>(from.sp_)->context,
              &static_cast<UcontextFiber*>(to.sp_)->context);
#endif
  from.Arrived();
}

void Fiber::Arrived() {
#if defined(SYNCNORM_EMU_ASAN)
  const void* from_bottom = nullptr;
  size_t from_bytes = 0;
  __sanitizer_finish_switch_fiber(asan_fake_stack_, &from_bottom, &from_bytes);
  if (from_ != nullptr && from_->stack_bottom_ == nullptr) {
    from_->stack_bottom_ = from_bottom;
    from_->stack_bytes_ = from_bytes;
  }
#endif
}

void Fiber::LandedByJump(Fiber& here) {
#if defined(SYNCNORM_EMU_ASAN)
  // here switched away once at least, so its stack bounds are known.
  __sanitizer_start_switch_fiber(nullptr, here.stack_bottom_,
                                 here.stack_bytes_);
  __sanitizer_finish_switch_fiber(here.asan_fake_stack_, nullptr, nullptr);
#endif
#if defined(SYNCNORM_EMU_TSAN)
  if (here.tsan_fiber_ != nullptr) __tsan_switch_to_fiber(here.tsan_fiber_, 0);
#endif
  (void)here;
}

}  // namespace syncnorm::emu
