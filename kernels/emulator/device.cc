#include "kernels/emulator/device.h"

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "kernels/emulator/fiber.h"

// The coordinates of the running thread (cuda_runtime.h).
uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace syncnorm::emu {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;

enum class LaneState { kReady, kBarrier, kWarp, kExited, kFaulted };

// One CUDA thread of the running block.
struct Lane {
  Fiber fiber;
  uint3 idx{};
  int id = 0;  // linear index in the block
  LaneState state = LaneState::kReady;
  // Where it waits (kBarrier, kWarp).
  const char* file = "";
  int line = 0;
  // Its warp call (kWarp).
  bool sync_only = false;  // __syncwarp
  ShuffleKind kind = ShuffleKind::kDown;
  unsigned mask = 0;
  uint64_t bits = 0;
  int arg = 0;
  int width = kWarp;
  uint64_t result = 0;
};

// A __shared__ variable of the running block.
constexpr size_t kSharedAlign = 64;
struct AlignedDelete {
  void operator()(char* p) const {
    ::operator delete(p, std::align_val_t(kSharedAlign));
  }
};
struct SharedVar {
  const char* file = "";
  int line = 0;
  std::unique_ptr<char, AlignedDelete> storage;
};

// The block being run.
struct Block {
  const KernelLaunch* launch = nullptr;
  uint3 idx{};
  int threads = 0;
  Fiber scheduler;
  std::vector<std::unique_ptr<Lane>> lanes;
  unsigned warp_arrived[kMaxThreads / kWarp] = {};  // lanes at a warp call
  std::vector<SharedVar> shared;  // made on first use, per block
  size_t shared_bytes = 0;
  size_t shared_limit = 0;
  cudaError_t code = cudaSuccess;
  std::string fault;
};

// Set while a kernel runs (under the runtime's lock).
Block* running = nullptr;
Lane* current = nullptr;
std::vector<std::unique_ptr<FiberStack>> stacks;

// Fault handling: an access to a guard page (or anything unmapped) in a
// kernel jumps back to RunKernel.
sigjmp_buf fault_jump;
volatile sig_atomic_t in_kernel = 0;
uintptr_t fault_address = 0;

std::string Where(const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line);
}

std::string Dim(uint3 v) {
  return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " +
         std::to_string(v.z) + ")";
}

std::string Mask(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", m);
  return buf;
}

// "kernel K block (x, y, z)" for messages.
std::string Context(const Block& b) {
  return "kernel " + std::string(b.launch->name) + " block " + Dim(b.idx);
}

// Thread ids as ranges: "0-31, 40, 64-95".
std::string Ranges(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

void SetFault(Block& b, cudaError_t code, const std::string& what) {
  if (b.code != cudaSuccess) return;
  b.code = code;
  b.fault = Context(b) + ": " + what;
}

// Records a fault the calling lane found itself. Its caller then ends the
// lane with EndFaultedLane, in a statement of its own, so that no
// temporary that owns memory is alive on the abandoned fiber's stack.
void RecordLaneFault(cudaError_t code, const std::string& what) {
  const Lane& lane = *current;
  SetFault(
      *running, code,
      "thread " + std::to_string(lane.id) + " " + Dim(lane.idx) + ": " + what);
}

// Ends the calling lane for good (see RecordLaneFault).
[[noreturn]] void EndFaultedLane() {
  Lane& lane = *current;
  lane.state = LaneState::kFaulted;
  Fiber::Switch(lane.fiber, running->scheduler, /*from_dies=*/true);
  std::abort();  // never resumed
}

#define SYNCNORM_EMU_LANE_FAULT(code, what) \
  do {                                      \
    RecordLaneFault(code, what);            \
    EndFaultedLane();                       \
  } while (0)

Lane& CurrentLane(const char* what) {
  if (current == nullptr) {
    std::fprintf(stderr, "CUDA emulator: %s called outside a kernel\n", what);
    std::abort();
  }
  return *current;
}

void Yield(Lane& lane) { Fiber::Switch(lane.fiber, running->scheduler); }

void LaneMain(void* arg) {
  Lane& lane = *static_cast<Lane*>(arg);
  running->launch->body();
  lane.state = LaneState::kExited;
  Fiber::Switch(lane.fiber, running->scheduler, /*from_dies=*/true);
  std::abort();  // never resumed
}

// The lane of warp `warp` whose index in the warp is j, or nullptr if the
// block has no such thread.
Lane* WarpLane(Block& b, int warp, int j) {
  const int id = warp * kWarp + j;
  return id < b.threads ? b.lanes[id].get() : nullptr;
}

int SourceLane(const Lane& l, int j) {
  const int base = j / l.width * l.width;
  const int pos = j % l.width;
  int s = pos;
  switch (l.kind) {
    case ShuffleKind::kDown:
      s = pos + l.arg;
      break;
    case ShuffleKind::kUp:
      s = pos - l.arg;
      break;
    case ShuffleKind::kXor: {
      // An earlier segment may be read, a later one not (CUDA's rule).
      const int src = j ^ l.arg;
      return src >= base + l.width ? j : src;
    }
    case ShuffleKind::kIndex:
      s = ((l.arg % l.width) + l.width) % l.width;
      break;
  }
  if (s < 0 || s >= l.width) return j;  // out of the segment: own value
  return base + s;
}

const char* CallName(const Lane& l) {
  if (l.sync_only) return "__syncwarp";
  switch (l.kind) {
    case ShuffleKind::kDown:
      return "__shfl_down_sync";
    case ShuffleKind::kUp:
      return "__shfl_up_sync";
    case ShuffleKind::kXor:
      return "__shfl_xor_sync";
    case ShuffleKind::kIndex:
      return "__shfl_sync";
  }
  return "?";
}

// "__shfl_down_sync at file:line with mask 0x...", for messages.
std::string CallAt(const Lane& l) {
  return std::string(CallName(l)) + " at " + Where(l.file, l.line) +
         " with mask " + Mask(l.mask);
}

// A warp call of `lane` (already recorded): checks it, and when every lane
// of its mask has arrived at the same call, completes it for all of them.
// Returns whether it completed; faults end the calling lane.
bool ArriveAtWarpCall(Block& b, Lane& lane) {
  const int warp = lane.id / kWarp;
  const int me = lane.id % kWarp;
  const int lanes = std::min(kWarp, b.threads - warp * kWarp);
  const unsigned existing = lanes == kWarp ? 0xffffffffu : ((1u << lanes) - 1u);
  if (lane.width < 1 || lane.width > kWarp ||
      (lane.width & (lane.width - 1)) != 0) {
    SYNCNORM_EMU_LANE_FAULT(cudaErrorIllegalInstruction,
                            CallAt(lane) + ": width " +
                                std::to_string(lane.width) +
                                " is not a power of two up to 32");
  }
  if ((lane.mask & (1u << me)) == 0) {
    SYNCNORM_EMU_LANE_FAULT(cudaErrorIllegalInstruction,
                            CallAt(lane) +
                                ": the mask leaves out the calling lane " +
                                std::to_string(me));
  }
  if ((lane.mask & ~existing) != 0) {
    SYNCNORM_EMU_LANE_FAULT(
        cudaErrorIllegalInstruction,
        CallAt(lane) + ": the mask names lanes this block of " +
            std::to_string(b.threads) + " threads does not have");
  }
  unsigned& arrived = b.warp_arrived[warp];
  arrived |= 1u << me;
  if ((arrived & lane.mask) != lane.mask) return false;  // not all there yet
  for (int j = 0; j < kWarp; ++j) {
    if ((lane.mask & (1u << j)) == 0) continue;
    const Lane& o = *WarpLane(b, warp, j);
    if (o.file != lane.file || o.line != lane.line || o.mask != lane.mask ||
        o.sync_only != lane.sync_only || o.kind != lane.kind ||
        o.width != lane.width) {
      SYNCNORM_EMU_LANE_FAULT(
          cudaErrorIllegalInstruction,
          CallAt(lane) + ": lane " + std::to_string(j) + " of the mask is at " +
              CallAt(o) +
              " instead; every lane of a mask must take part in "
              "the same call");
    }
    if (o.sync_only) continue;
    const int src = SourceLane(o, j);
    if ((lane.mask & (1u << src)) == 0) {
      SYNCNORM_EMU_LANE_FAULT(cudaErrorIllegalInstruction,
                              CallAt(lane) + ": lane " + std::to_string(j) +
                                  " reads lane " + std::to_string(src) +
                                  ", which is not in the mask");
    }
  }
  for (int j = 0; j < kWarp; ++j) {
    if ((lane.mask & (1u << j)) == 0) continue;
    Lane& o = *WarpLane(b, warp, j);
    if (!o.sync_only) o.result = WarpLane(b, warp, SourceLane(o, j))->bits;
    o.state = LaneState::kReady;
  }
  arrived &= ~lane.mask;
  return true;
}

uint64_t WarpCall(const char* file, int line, bool sync_only, ShuffleKind kind,
                  unsigned mask, uint64_t bits, int arg, int width) {
  Lane& lane = CurrentLane("a warp function");
  lane.state = LaneState::kWarp;
  lane.file = file;
  lane.line = line;
  lane.sync_only = sync_only;
  lane.kind = kind;
  lane.mask = mask;
  lane.bits = bits;
  lane.arg = arg;
  lane.width = width;
  if (!ArriveAtWarpCall(*running, lane)) Yield(lane);
  return lane.result;
}

// What the lanes that are not ready wait for, when none can go on.
std::string DescribeStall(const Block& b) {
  std::vector<int> exited;
  std::string s;
  // Group the waiting lanes by call site.
  std::vector<bool> seen(b.threads, false);
  for (int t = 0; t < b.threads; ++t) {
    const Lane& l = *b.lanes[t];
    if (l.state == LaneState::kExited) exited.push_back(t);
    if (seen[t] ||
        (l.state != LaneState::kBarrier && l.state != LaneState::kWarp)) {
      continue;
    }
    std::vector<int> group;
    for (int u = t; u < b.threads; ++u) {
      const Lane& o = *b.lanes[u];
      if (!seen[u] && o.state == l.state && o.file == l.file &&
          o.line == l.line && o.mask == l.mask) {
        seen[u] = true;
        group.push_back(u);
      }
    }
    if (!s.empty()) s += "; ";
    s += "threads " + Ranges(group) + " wait at " +
         (l.state == LaneState::kBarrier
              ? std::string("__syncthreads")
              : std::string(CallName(l)) + " (mask " + Mask(l.mask) + ")") +
         " at " + Where(l.file, l.line);
  }
  if (!exited.empty()) s += "; threads " + Ranges(exited) + " have exited";
  return s;
}

// Called when no lane is ready: releases a barrier that every thread has
// reached, or records the deadlock. Returns whether the block goes on.
bool ReleaseOrDeadlock(Block& b) {
  int barrier = 0, exited = 0;
  const Lane* first = nullptr;
  bool same_site = true;
  for (int t = 0; t < b.threads; ++t) {
    const Lane& l = *b.lanes[t];
    if (l.state == LaneState::kExited) ++exited;
    if (l.state != LaneState::kBarrier) continue;
    ++barrier;
    if (first == nullptr) first = &l;
    same_site = same_site && l.file == first->file && l.line == first->line;
  }
  if (barrier == b.threads && same_site) {
    for (auto& l : b.lanes) l->state = LaneState::kReady;
    return true;
  }
  if (exited == b.threads) return false;
  SetFault(b, cudaErrorLaunchTimeout,
           "deadlock: " + DescribeStall(b) +
               ". Every thread of a block must reach the same __syncthreads, "
               "and every lane of a mask the same warp call");
  return false;
}

FiberStack& Stack(int t) {
  while (static_cast<int>(stacks.size()) <= t) {
    stacks.push_back(std::make_unique<FiberStack>(FiberStackBytes()));
  }
  return *stacks[t];
}

// Runs one block to its end or its first fault.
void RunBlock(Block& b) {
  b.shared.clear();
  b.shared_bytes = 0;
  blockIdx = b.idx;
  std::fill(std::begin(b.warp_arrived), std::end(b.warp_arrived), 0u);
  const dim3 d = b.launch->block;
  for (int t = 0; t < b.threads; ++t) {
    Lane& l = *b.lanes[t];
    l.id = t;
    l.idx = uint3{t % d.x, (t / d.x) % d.y, t / (d.x * d.y)};
    l.state = LaneState::kReady;
    l.fiber.Start(&Stack(t), &LaneMain, &l);
  }
  const uint64_t linear =
      b.idx.x + static_cast<uint64_t>(b.idx.y) * b.launch->grid.x;
  for (int phase = 0;; ++phase) {
    // Each phase runs every ready thread up to its next barrier, warp call
    // or exit, alternately forwards and backwards.
    const bool backwards = ((phase + linear) & 1) != 0;
    bool any_ready = true;
    while (any_ready) {
      any_ready = false;
      for (int k = 0; k < b.threads; ++k) {
        const int t = backwards ? b.threads - 1 - k : k;
        Lane& l = *b.lanes[t];
        if (l.state != LaneState::kReady) continue;
        current = &l;
        threadIdx = l.idx;
        Fiber::Switch(b.scheduler, l.fiber);
        current = nullptr;
        if (b.code != cudaSuccess) return;
        any_ready = true;
      }
    }
    if (!ReleaseOrDeadlock(b)) return;
  }
}

void OnFault(int, siginfo_t* info, void*) {
  if (!in_kernel) {
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    return;  // the access repeats and the default action ends the process
  }
  fault_address = reinterpret_cast<uintptr_t>(info->si_addr);
  siglongjmp(fault_jump, 1);
}

// Installs the fault handler (on an alternate stack, so that a fiber's
// stack overflow is caught too) for the scope.
class FaultScope {
 public:
  FaultScope() {
    static thread_local std::unique_ptr<char[]> alt;
    constexpr size_t kAltBytes = 256 * 1024;
    if (alt == nullptr) alt.reset(new char[kAltBytes]);
    stack_t ss{};
    ss.ss_sp = alt.get();
    ss.ss_size = kAltBytes;
    sigaltstack(&ss, &old_stack_);
    struct sigaction sa {};
    sa.sa_sigaction = &OnFault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv_);
    sigaction(SIGBUS, &sa, &old_bus_);
  }
  ~FaultScope() {
    sigaction(SIGSEGV, &old_segv_, nullptr);
    sigaction(SIGBUS, &old_bus_, nullptr);
    sigaltstack(&old_stack_, nullptr);
  }

 private:
  stack_t old_stack_{};
  struct sigaction old_segv_ {};
  struct sigaction old_bus_ {};
};

// RunBlock, with an illegal access turned into the block's fault.
void RunBlockCatchingFaults(Block& b, std::string (*describe)(uintptr_t)) {
  if (sigsetjmp(fault_jump, 1) == 0) {
    in_kernel = 1;
    RunBlock(b);
    in_kernel = 0;
    return;
  }
  in_kernel = 0;
  Fiber::LandedByJump(b.scheduler);
  const int t = current != nullptr ? current->id : -1;
  current = nullptr;
  SetFault(b, cudaErrorIllegalAddress,
           "thread " + std::to_string(t) + ": illegal access at " +
               describe(fault_address));
}

}  // namespace

void SyncThreads(const char* file, int line) {
  Lane& lane = CurrentLane("__syncthreads");
  lane.state = LaneState::kBarrier;
  lane.file = file;
  lane.line = line;
  Yield(lane);
}

uint64_t Shuffle(const char* file, int line, ShuffleKind kind, unsigned mask,
                 uint64_t bits, int lane_arg, int width) {
  return WarpCall(file, line, false, kind, mask, bits, lane_arg, width);
}

void SyncWarp(const char* file, int line, unsigned mask) {
  WarpCall(file, line, true, ShuffleKind::kIndex, mask, 0, 0, kWarp);
}

void* SharedStorage(const char* file, int line, size_t bytes, size_t align) {
  CurrentLane("a __shared__ variable");
  Block& b = *running;
  for (const SharedVar& v : b.shared) {
    if (v.line == line && (v.file == file || std::strcmp(v.file, file) == 0)) {
      return v.storage.get();
    }
  }
  b.shared_bytes += (bytes + 15) / 16 * 16;
  if (b.shared_bytes + b.launch->shared_bytes > b.shared_limit) {
    SYNCNORM_EMU_LANE_FAULT(
        cudaErrorLaunchFailure,
        "the block's __shared__ variables (" + std::to_string(b.shared_bytes) +
            " bytes with the one at " + Where(file, line) + ") and " +
            std::to_string(b.launch->shared_bytes) +
            " dynamic bytes exceed the " + std::to_string(b.shared_limit) +
            " a block may have");
  }
  SharedVar v;
  v.file = file;
  v.line = line;
  if (align > kSharedAlign) {
    SYNCNORM_EMU_LANE_FAULT(cudaErrorLaunchFailure,
                            "the __shared__ variable at " + Where(file, line) +
                                " wants an alignment over 64 bytes");
  }
  v.storage.reset(static_cast<char*>(
      ::operator new(bytes, std::align_val_t(kSharedAlign))));
  std::memset(v.storage.get(), 0xff, bytes);
  b.shared.push_back(std::move(v));
  return b.shared.back().storage.get();
}

KernelRun RunKernel(const KernelLaunch& launch, size_t shared_limit,
                    std::string (*describe)(uintptr_t address)) {
  KernelRun run;
  // Heap-allocated so that nothing of it lives on a stack a fault abandons.
  auto block = std::make_unique<Block>();
  Block& b = *block;
  b.launch = &launch;
  b.shared_limit = shared_limit;
  b.threads =
      static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
  if (b.threads > kMaxThreads) b.threads = kMaxThreads;  // checked at launch
  for (int t = 0; t < b.threads; ++t)
    b.lanes.push_back(std::make_unique<Lane>());
  blockDim = launch.block;
  gridDim = launch.grid;
  running = &b;
  FaultScope scope;
  for (unsigned z = 0; z < launch.grid.z && b.code == cudaSuccess; ++z) {
    for (unsigned y = 0; y < launch.grid.y && b.code == cudaSuccess; ++y) {
      for (unsigned x = 0; x < launch.grid.x && b.code == cudaSuccess; ++x) {
        b.idx = uint3{x, y, z};
        RunBlockCatchingFaults(b, describe);
        ++run.blocks;
        run.threads += b.threads;
      }
    }
  }
  running = nullptr;
  run.code = b.code;
  run.fault = b.fault;
  // A faulted block's lanes are abandoned mid-kernel; their stacks are
  // reused by the next launch.
  return run;
}

}  // namespace syncnorm::emu
