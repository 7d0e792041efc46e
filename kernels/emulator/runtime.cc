// The emulator's runtime API (cuda_runtime.h) and control panel
// (emulator.h): devices, memory, streams as queues, events, memory pools,
// launches and errors.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/emulator/device.h"
#include "kernels/emulator/emulator.h"
#include "kernels/emulator/memory.h"

namespace syncnorm::emu {

struct Stream {
  int device = 0;
  bool destroyed = false;
  int64_t queued = 0;  // operations queued and not run yet
};

struct Event {
  bool destroyed = false;
  int64_t queued = 0;  // records queued and not run yet
};

struct Pool {
  int device = 0;
  uint64_t release_threshold = 0;
  int64_t allocations = 0;
  bool created = false;  // by cudaMemPoolCreate (not a device's default)
  bool destroyed = false;
};

namespace {

constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockXY = 1024;
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 2147483647u;
constexpr unsigned kMaxGridYZ = 65535u;

// A queued operation of a stream.
struct Op {
  Stream* stream;
  std::function<void()> run;
};

struct State {
  std::mutex mu;
  Config config;
  MemoryTable memory;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Stream>> legacy;  // per device: stream 0
  std::vector<std::unique_ptr<Event>> events;
  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<Pool*> default_pools;  // per device, made on first use
  std::deque<Op> queue;
  cudaError_t sticky = cudaSuccess;
  std::string fault;
  Counters counters;
};

State& S() {
  static State* state = [] {
    auto* s = new State;
    s->legacy.push_back(std::make_unique<Stream>());
    return s;
  }();
  return *state;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

// Returns e, remembering it for cudaGetLastError when it is an error.
cudaError_t Fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// A fault: sticky, described by cudaGetErrorString.
void SetFault(State& s, cudaError_t code, const std::string& what) {
  if (s.sticky != cudaSuccess) return;
  s.sticky = code;
  s.fault = std::string(cudaGetErrorName(code)) + ": " + what;
  std::fprintf(stderr, "CUDA emulator fault: %s\n", s.fault.c_str());
  s.queue.clear();
}

// The error every call returns before doing anything, if any.
cudaError_t Precheck(const State& s) {
  if (!s.config.driver) return cudaErrorInsufficientDriver;
  return s.sticky;
}

#define EMU_ENTER()                       \
  State& s = S();                         \
  std::lock_guard<std::mutex> lock(s.mu); \
  if (const cudaError_t pre = Precheck(s); pre != cudaSuccess) return Fail(pre)

bool ValidDevice(const State& s, int d) {
  return d >= 0 && d < s.config.devices;
}

Stream* Resolve(State& s, cudaStream_t stream) {
  if (stream == nullptr) {
    if (!ValidDevice(s, current_device)) return nullptr;
    return s.legacy[current_device].get();
  }
  for (const auto& p : s.streams) {
    if (p.get() == stream) return p->destroyed ? nullptr : p.get();
  }
  return nullptr;
}

Event* FindEvent(State& s, cudaEvent_t e) {
  for (const auto& p : s.events) {
    if (p.get() == e) return p->destroyed ? nullptr : p.get();
  }
  return nullptr;
}

Pool* FindPool(State& s, cudaMemPool_t pool) {
  for (const auto& p : s.pools) {
    if (p.get() == pool) return p->destroyed ? nullptr : p.get();
  }
  return nullptr;
}

void Enqueue(State& s, Stream* stream, std::function<void()> run) {
  ++stream->queued;
  s.queue.push_back(Op{stream, std::move(run)});
}

// Runs every queued operation, in order (one legal order of CUDA's
// streams: each operation after everything queued before it).
void Drain(State& s) {
  ++s.counters.synchronizations;
  while (!s.queue.empty()) {
    Op op = std::move(s.queue.front());
    s.queue.pop_front();
    --op.stream->queued;
    op.run();
  }
}

std::string DescribeAddress(uintptr_t p) { return S().memory.Describe(p); }

bool IsDevice(const Allocation* a) {
  return a != nullptr && a->kind == MemoryKind::kDevice;
}

// Frees `a` (unmapping it); a write past its end becomes the fault.
void Release(State& s, Allocation* a) {
  const std::string problem = s.memory.Unmap(a);
  if (!problem.empty()) SetFault(s, cudaErrorIllegalAddress, problem);
}

cudaError_t MapInto(State& s, void** ptr, size_t size, MemoryKind kind,
                    int device, Pool* pool) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  Allocation* a = s.memory.Map(size, kind, device, pool);
  if (a == nullptr) return Fail(cudaErrorMemoryAllocation);
  *ptr = a->ptr;
  return cudaSuccess;
}

Pool* DefaultPool(State& s, int device) {
  if (s.default_pools.empty()) {
    s.default_pools.assign(static_cast<size_t>(s.config.devices), nullptr);
  }
  Pool*& p = s.default_pools[device];
  if (p == nullptr) {
    s.pools.push_back(std::make_unique<Pool>());
    p = s.pools.back().get();
    p->device = device;
  }
  return p;
}

cudaError_t AllocateFromPool(State& s, void** ptr, size_t size, Pool* pool,
                             Stream* stream) {
  if (pool->device != stream->device) return Fail(cudaErrorInvalidValue);
  const cudaError_t e =
      MapInto(s, ptr, size, MemoryKind::kDevice, pool->device, pool);
  if (e == cudaSuccess && size > 0) {
    ++pool->allocations;
    ++s.counters.async_mallocs;
  }
  return e;
}

// A copy's direction from the memory at both ends. Also checks ranges.
cudaError_t PlanCopy(State& s, void* dst, const void* src, size_t n,
                     cudaMemcpyKind kind, Allocation** d, Allocation** h) {
  Allocation* da = nullptr;
  Allocation* sa = nullptr;
  const bool dst_in = s.memory.Contains(dst, n, &da);
  const bool src_in = s.memory.Contains(src, n, &sa);
  if ((da != nullptr && !dst_in) || (sa != nullptr && !src_in)) {
    return Fail(cudaErrorInvalidValue);  // runs past an allocation's end
  }
  const bool to_device = IsDevice(da);
  const bool from_device = IsDevice(sa);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = to_device && !from_device;
      break;
    case cudaMemcpyDeviceToHost:
      ok = from_device && !to_device;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = from_device && to_device;
      break;
    case cudaMemcpyHostToHost:
      ok = !from_device && !to_device;
      break;
    case cudaMemcpyDefault:
      break;
  }
  if (!ok) return Fail(cudaErrorInvalidValue);
  *d = da;
  *h = sa;
  return cudaSuccess;
}

// At run time, whether the allocation copied from or to is still there.
bool Alive(State& s, const void* p, uint64_t id) {
  if (id == 0) return true;  // host memory the emulator does not track
  const Allocation* a = s.memory.Find(p);
  return a != nullptr && a->id == id;
}

cudaError_t QueueCopy(State& s, void* dst, const void* src, size_t n,
                      cudaMemcpyKind kind, Stream* stream) {
  Allocation* da = nullptr;
  Allocation* sa = nullptr;
  if (const cudaError_t e = PlanCopy(s, dst, src, n, kind, &da, &sa);
      e != cudaSuccess) {
    return e;
  }
  if (n == 0) return cudaSuccess;
  const uint64_t dst_id = da != nullptr ? da->id : 0;
  const uint64_t src_id = sa != nullptr ? sa->id : 0;
  std::shared_ptr<std::vector<char>> staged;
  if (sa == nullptr && IsDevice(da)) {
    // From pageable memory: CUDA stages the bytes now (and may wait).
    staged = std::make_shared<std::vector<char>>(
        static_cast<const char*>(src), static_cast<const char*>(src) + n);
    ++s.counters.pageable_uploads;
  }
  Enqueue(s, stream, [&s, dst, src, n, dst_id, src_id, staged] {
    if (!Alive(s, dst, dst_id) || !Alive(s, src, src_id)) {
      SetFault(s, cudaErrorIllegalAddress,
               "a copy ran after its source or destination was freed");
      return;
    }
    std::memcpy(dst, staged != nullptr ? staged->data() : src, n);
  });
  if (da == nullptr && IsDevice(sa)) {
    // To pageable memory: the call returns once the copy is done.
    ++s.counters.pageable_downloads;
    Drain(s);
  }
  return cudaSuccess;
}

const char* ErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchTimeout:
      return "cudaErrorLaunchTimeout";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress:
      return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char* ErrorText(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchTimeout:
      return "the launch timed out and was terminated";
    case cudaErrorIllegalInstruction:
      return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
  }
  return "unknown error";
}

// A launch's configuration against the device's limits; "" when valid.
std::string CheckConfiguration(const State& s, const KernelLaunch& l) {
  const dim3 b = l.block;
  const dim3 g = l.grid;
  const uint64_t threads = static_cast<uint64_t>(b.x) * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > kMaxBlockXY ||
      b.y > kMaxBlockXY || b.z > kMaxBlockZ || threads > kMaxThreadsPerBlock) {
    return "block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " +
           std::to_string(b.z) +
           ") is outside the device's limits "
           "(1024 x 1024 x 64, 1024 threads)";
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > kMaxGridX || g.y > kMaxGridYZ ||
      g.z > kMaxGridYZ) {
    return "grid (" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " +
           std::to_string(g.z) +
           ") is outside the device's limits "
           "(2^31 - 1 x 65535 x 65535)";
  }
  // The __shared__ variables are added as blocks make them (device.h).
  if (l.shared_bytes > static_cast<size_t>(s.config.shared_memory_per_block)) {
    return std::to_string(l.shared_bytes) +
           " bytes of dynamic shared memory exceed the " +
           std::to_string(s.config.shared_memory_per_block) +
           " a block may have";
  }
  return "";
}

}  // namespace

// ---- kernel launches ------------------------------------------------------

void Launch(KernelLaunch launch, const void* const* pointers,
            int pointer_count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (const cudaError_t pre = Precheck(s); pre != cudaSuccess) {
    Fail(pre);
    return;
  }
  const std::string bad = CheckConfiguration(s, launch);
  if (!bad.empty()) {
    std::fprintf(stderr, "CUDA emulator: launch of %s: %s\n", launch.name,
                 bad.c_str());
    Fail(cudaErrorInvalidConfiguration);
    return;
  }
  Stream* stream = Resolve(s, launch.stream);
  if (stream == nullptr || stream->device != current_device) {
    Fail(cudaErrorInvalidResourceHandle);
    return;
  }
  for (int i = 0; i < pointer_count; ++i) {
    if (pointers[i] == nullptr) continue;
    const Allocation* a = s.memory.Find(pointers[i]);
    if (!IsDevice(a) || a->device != current_device) {
      SetFault(s, cudaErrorIllegalAddress,
               "kernel " + std::string(launch.name) + ": pointer argument " +
                   std::to_string(i) + " is not memory of device " +
                   std::to_string(current_device) + " (" +
                   DescribeAddress(reinterpret_cast<uintptr_t>(pointers[i])) +
                   ")");
      Fail(s.sticky);
      return;
    }
  }
  ++s.counters.launches;
  auto shared = std::make_shared<KernelLaunch>(std::move(launch));
  Enqueue(s, stream, [&s, shared] {
    const KernelRun run = RunKernel(
        *shared, static_cast<size_t>(s.config.shared_memory_per_block),
        &DescribeAddress);
    s.counters.blocks += run.blocks;
    s.counters.threads += run.threads;
    if (run.code != cudaSuccess) SetFault(s, run.code, run.fault);
  });
}

// ---- control panel
// ------------------------------------------------------------

void Reset(const Config& config) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.queue.clear();
  s.memory.Clear();
  s.streams.clear();
  s.events.clear();
  s.pools.clear();
  s.default_pools.clear();
  s.config = config;
  s.legacy.clear();
  for (int d = 0; d < std::max(1, config.devices); ++d) {
    s.legacy.push_back(std::make_unique<Stream>());
    s.legacy.back()->device = d;
  }
  s.sticky = cudaSuccess;
  s.fault.clear();
  s.counters = Counters{};
  last_error = cudaSuccess;
  current_device = 0;
}

Counters GetCounters() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.counters;
}

std::vector<PoolInfo> Pools() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<PoolInfo> out;
  for (const auto& p : s.pools) {
    if (p->created) {
      out.push_back(PoolInfo{p->device, p->release_threshold, p->allocations});
    }
  }
  return out;
}

std::string Fault() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.fault;
}

}  // namespace syncnorm::emu

// ---- the runtime API
// ------------------------------------------------------------

using namespace syncnorm::emu;  // NOLINT: the runtime's own helpers

const char* cudaGetErrorName(cudaError_t error) { return ErrorName(error); }

const char* cudaGetErrorString(cudaError_t error) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (error != cudaSuccess && error == s.sticky) return s.fault.c_str();
  return ErrorText(error);
}

cudaError_t cudaGetLastError() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (const cudaError_t pre = Precheck(s); pre != cudaSuccess) return pre;
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (const cudaError_t pre = Precheck(s); pre != cudaSuccess) return pre;
  return last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = 0;
  if (!s.config.driver) return Fail(cudaErrorInsufficientDriver);
  if (s.config.devices == 0) return Fail(cudaErrorNoDevice);
  *count = s.config.devices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  EMU_ENTER();
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  EMU_ENTER();
  if (!ValidDevice(s, device)) return Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr,
                                   int device) {
  EMU_ENTER();
  if (value == nullptr) return Fail(cudaErrorInvalidValue);
  if (!ValidDevice(s, device)) return Fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = kMaxThreadsPerBlock;
      break;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
      *value = static_cast<int>(kMaxBlockXY);
      break;
    case cudaDevAttrMaxBlockDimZ:
      *value = static_cast<int>(kMaxBlockZ);
      break;
    case cudaDevAttrMaxGridDimX:
      *value = static_cast<int>(kMaxGridX);
      break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ:
      *value = static_cast<int>(kMaxGridYZ);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = s.config.shared_memory_per_block;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = s.config.multiprocessors;
      break;
    case cudaDevAttrL2CacheSize:
      *value = s.config.l2_bytes;
      break;
    case cudaDevAttrMemoryPoolsSupported:
      *value = s.config.memory_pools ? 1 : 0;
      break;
    default:
      return Fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  EMU_ENTER();
  Drain(s);
  return Fail(s.sticky);
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  EMU_ENTER();
  if (!ValidDevice(s, current_device)) return Fail(cudaErrorInvalidDevice);
  const cudaError_t e =
      MapInto(s, ptr, size, MemoryKind::kDevice, current_device, nullptr);
  if (e == cudaSuccess && size > 0) ++s.counters.device_mallocs;
  return e;
}

cudaError_t cudaFree(void* ptr) {
  EMU_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  Allocation* a = s.memory.Starting(ptr);
  if (a == nullptr || a->kind != MemoryKind::kDevice || a->pool != nullptr) {
    return Fail(cudaErrorInvalidValue);
  }
  Drain(s);  // cudaFree synchronizes
  Release(s, a);
  return Fail(s.sticky);
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  EMU_ENTER();
  const cudaError_t e =
      MapInto(s, ptr, size, MemoryKind::kPinned, current_device, nullptr);
  if (e == cudaSuccess && size > 0) ++s.counters.pinned_allocs;
  return e;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (flags != cudaHostAllocDefault) return Fail(cudaErrorInvalidValue);
  return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void* ptr) {
  EMU_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  Allocation* a = s.memory.Starting(ptr);
  if (a == nullptr || a->kind != MemoryKind::kPinned) {
    return Fail(cudaErrorInvalidValue);
  }
  Drain(s);
  Release(s, a);
  return Fail(s.sticky);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                     const void* ptr) {
  EMU_ENTER();
  if (attributes == nullptr || ptr == nullptr) {
    return Fail(cudaErrorInvalidValue);
  }
  *attributes =
      cudaPointerAttributes{cudaMemoryTypeUnregistered, -1, nullptr, nullptr};
  const Allocation* a = s.memory.Find(ptr);
  if (a == nullptr) return cudaSuccess;
  attributes->device = a->device;
  if (a->kind == MemoryKind::kDevice) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind) {
  EMU_ENTER();
  Stream* stream = Resolve(s, nullptr);
  if (stream == nullptr) return Fail(cudaErrorInvalidDevice);
  if (const cudaError_t e = QueueCopy(s, dst, src, count, kind, stream);
      e != cudaSuccess) {
    return e;
  }
  Drain(s);
  return Fail(s.sticky);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  EMU_ENTER();
  Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = QueueCopy(s, dst, src, count, kind, st);
      e != cudaSuccess) {
    return e;
  }
  return Fail(s.sticky);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count,
                            cudaStream_t stream) {
  EMU_ENTER();
  Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  Allocation* a = nullptr;
  if (!s.memory.Contains(ptr, count, &a) || !IsDevice(a)) {
    return Fail(cudaErrorInvalidValue);
  }
  const uint64_t id = a->id;
  Enqueue(s, st, [&s, ptr, value, count, id] {
    if (!Alive(s, ptr, id)) {
      SetFault(s, cudaErrorIllegalAddress, "a memset ran after a free");
      return;
    }
    std::memset(ptr, value, count);
  });
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  EMU_ENTER();
  if (!s.config.memory_pools) return Fail(cudaErrorNotSupported);
  Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  return AllocateFromPool(s, ptr, size, DefaultPool(s, st->device), st);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  EMU_ENTER();
  if (!s.config.memory_pools) return Fail(cudaErrorNotSupported);
  Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (ptr == nullptr) return cudaSuccess;
  Allocation* a = s.memory.Starting(ptr);
  if (a == nullptr || a->pool == nullptr) return Fail(cudaErrorInvalidValue);
  const uint64_t id = a->id;
  Enqueue(s, st, [&s, ptr, id] {
    Allocation* live = s.memory.Starting(ptr);
    if (live == nullptr || live->id != id) {
      SetFault(s, cudaErrorIllegalAddress, "memory freed twice");
      return;
    }
    Release(s, live);
  });
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool,
                              const cudaMemPoolProps* props) {
  EMU_ENTER();
  if (!s.config.memory_pools) return Fail(cudaErrorNotSupported);
  if (pool == nullptr || props == nullptr ||
      props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice ||
      !ValidDevice(s, props->location.id)) {
    return Fail(cudaErrorInvalidValue);
  }
  s.pools.push_back(std::make_unique<Pool>());
  Pool* p = s.pools.back().get();
  p->device = props->location.id;
  p->created = true;
  ++s.counters.pools_created;
  *pool = p;
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  EMU_ENTER();
  Pool* p = FindPool(s, pool);
  if (p == nullptr || !p->created) return Fail(cudaErrorInvalidValue);
  p->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                    void* value) {
  EMU_ENTER();
  Pool* p = FindPool(s, pool);
  if (p == nullptr || value == nullptr ||
      attr != cudaMemPoolAttrReleaseThreshold) {
    return Fail(cudaErrorInvalidValue);
  }
  std::memcpy(&p->release_threshold, value, sizeof(uint64_t));
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                    void* value) {
  EMU_ENTER();
  Pool* p = FindPool(s, pool);
  if (p == nullptr || value == nullptr ||
      attr != cudaMemPoolAttrReleaseThreshold) {
    return Fail(cudaErrorInvalidValue);
  }
  std::memcpy(value, &p->release_threshold, sizeof(uint64_t));
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  EMU_ENTER();
  if (!s.config.memory_pools) return Fail(cudaErrorNotSupported);
  Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  Pool* p = FindPool(s, pool);
  if (p == nullptr) return Fail(cudaErrorInvalidValue);
  return AllocateFromPool(s, ptr, size, p, st);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream,
                                      unsigned int flags) {
  EMU_ENTER();
  if (stream == nullptr || flags > cudaStreamNonBlocking) {
    return Fail(cudaErrorInvalidValue);
  }
  if (!ValidDevice(s, current_device)) return Fail(cudaErrorInvalidDevice);
  s.streams.push_back(std::make_unique<Stream>());
  s.streams.back()->device = current_device;
  *stream = s.streams.back().get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EMU_ENTER();
  Stream* st = stream == nullptr ? nullptr : Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  st->destroyed = true;  // its queued work still runs
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EMU_ENTER();
  if (Resolve(s, stream) == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  Drain(s);
  return Fail(s.sticky);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  EMU_ENTER();
  const Stream* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (s.config.queries_run_work) Drain(s);
  if (s.sticky != cudaSuccess) return Fail(s.sticky);
  // A query never makes progress; "not ready" is recorded as the last
  // error, as the CUDA runtime may do.
  return st->queued > 0 ? Fail(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags) {
  EMU_ENTER();
  // The queue runs in order, so a wait for an earlier record holds.
  if (Resolve(s, stream) == nullptr || FindEvent(s, event) == nullptr ||
      flags != 0) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  EMU_ENTER();
  if (event == nullptr || (flags & ~cudaEventDisableTiming) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  s.events.push_back(std::make_unique<syncnorm::emu::Event>());
  *event = s.events.back().get();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EMU_ENTER();
  syncnorm::emu::Event* e = FindEvent(s, event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  e->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  EMU_ENTER();
  syncnorm::emu::Event* e = FindEvent(s, event);
  Stream* st = Resolve(s, stream);
  if (e == nullptr || st == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  ++e->queued;
  Enqueue(s, st, [e] { --e->queued; });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  EMU_ENTER();
  const syncnorm::emu::Event* e = FindEvent(s, event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (s.config.queries_run_work) Drain(s);
  if (s.sticky != cudaSuccess) return Fail(s.sticky);
  return e->queued > 0 ? Fail(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  EMU_ENTER();
  if (FindEvent(s, event) == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  Drain(s);
  return Fail(s.sticky);
}
