// The CUDA runtime API and device built-ins as the CPU emulator provides
// them (kernels/emulator): the subset the project's .cu sources use, with
// CUDA's names, signatures and error codes, so that those sources compile
// unchanged as host C++ and run on the emulated device.
//
// Device side: every thread of a block is a fiber; __syncthreads is a block
// barrier and the __shfl_*_sync functions a rendezvous of the lanes named in
// their mask (see emulator.h for what is checked). Host side: streams are
// queues that run when something synchronizes with them; device memory sits
// between guard pages and starts out as NaN.
#ifndef SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_RUNTIME_H_
#define SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define SYNCNORM_CUDA_EMULATOR 1

// ---- qualifiers
// ---------------------------------------------------------------

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
// The emulator build rewrites each `__shared__ T name[N];` declaration of a
// .cu source into a reference to per-block storage (see
// syncnorm::emu::SharedVariable and kernels/emulator/prepare.sh); one that
// it could not rewrite fails to compile, naming this.
#define __shared__ \
  __shared___declarations_must_be_on_one_line_of_a_cu_source_see_prepare_sh

// ---- types
// --------------------------------------------------------------------

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

struct float2 {
  float x, y;
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrMemoryPoolsSupported = 115,
};

enum cudaMemAllocationType { cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType { cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};
struct cudaMemPoolProps {
  cudaMemAllocationType allocType;
  cudaMemAllocationHandleType handleTypes;
  cudaMemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 0x4 };

namespace syncnorm::emu {
struct Stream;
struct Event;
struct Pool;
}  // namespace syncnorm::emu
typedef syncnorm::emu::Stream* cudaStream_t;
typedef syncnorm::emu::Event* cudaEvent_t;
typedef syncnorm::emu::Pool* cudaMemPool_t;

constexpr unsigned int cudaStreamDefault = 0;
constexpr unsigned int cudaStreamNonBlocking = 1;
constexpr unsigned int cudaEventDefault = 0;
constexpr unsigned int cudaEventDisableTiming = 2;
constexpr unsigned int cudaHostAllocDefault = 0;

// ---- the runtime API
// ------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                     const void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count,
                            cudaStream_t stream = nullptr);

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool,
                              const cudaMemPoolProps* props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                    void* value);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                    void* value);
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

// ---- device built-ins
// -------------------------------------------------------------

// The executing thread's coordinates; set by the emulator on every switch
// to a thread's fiber.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

namespace syncnorm::emu {

enum class ShuffleKind { kDown, kUp, kXor, kIndex };

// See emulator.h: the block barrier and the warp rendezvous, by call site.
void SyncThreads(const char* file, int line);
uint64_t Shuffle(const char* file, int line, ShuffleKind kind, unsigned mask,
                 uint64_t bits, int lane_arg, int width);
void SyncWarp(const char* file, int line, unsigned mask = 0xffffffffu);

template <typename T>
T ShuffleValue(const char* file, int line, ShuffleKind kind, unsigned mask,
               T value, int lane_arg, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "the __shfl_*_sync functions move scalars of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = Shuffle(file, line, kind, mask, bits, lane_arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ---- kernel launches ------------------------------------------------------

// The launch of a kernel as a queued operation: `body` runs the kernel
// with its arguments (copied at launch, as CUDA copies them) for the
// current thread; it runs once per thread of each block.
struct KernelLaunch {
  const char* name;
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  std::function<void()> body;
};

// Validates the launch (configuration, stream, pointer arguments) and
// queues it on its stream; a bad configuration is cudaGetLastError's
// cudaErrorInvalidConfiguration, a pointer argument outside the device's
// memory a sticky cudaErrorIllegalAddress.
void Launch(KernelLaunch launch, const void* const* pointers,
            int pointer_count);

template <typename... Params>
class LaunchBuilder {
 public:
  LaunchBuilder(const char* name, void (*kernel)(Params...), dim3 grid,
                dim3 block, size_t shared_bytes, cudaStream_t stream)
      : kernel_(kernel), launch_{name, grid, block, shared_bytes, stream, {}} {}

  template <typename... Args>
  void operator()(Args&&... args) {
    static_assert(sizeof...(Args) == sizeof...(Params),
                  "a kernel launch passes one argument per parameter");
    using Tuple = std::tuple<std::decay_t<Params>...>;
    auto arguments = std::make_shared<Tuple>(std::forward<Args>(args)...);
    const void* pointers[sizeof...(Params) + 1] = {};
    int count = 0;
    std::apply(
        [&](const auto&... p) { ((CollectPointer(p, pointers, &count)), ...); },
        *arguments);
    launch_.body = [kernel = kernel_, arguments] {
      std::apply(kernel, *arguments);
    };
    Launch(std::move(launch_), pointers, count);
  }

 private:
  // Pointer arguments must point into device memory of the launch's device
  // (or be null): the emulator checks them at launch.
  template <typename P>
  static void CollectPointer(const P& p, const void** pointers, int* count) {
    if constexpr (std::is_pointer_v<P>) {
      pointers[(*count)++] = static_cast<const void*>(p);
    }
  }

  void (*kernel_)(Params...);
  KernelLaunch launch_;
};

template <typename... Params>
LaunchBuilder<Params...> Configure(const char* name, void (*kernel)(Params...),
                                   dim3 grid, dim3 block, size_t shared_bytes,
                                   cudaStream_t stream) {
  return LaunchBuilder<Params...>(name, kernel, grid, block, shared_bytes,
                                  stream);
}

}  // namespace syncnorm::emu

// kernel<<<grid, block, shared, stream>>>(args...) is written
// CUDA_EMULATOR_LAUNCH(grid, block, shared, stream, kernel)(args...); the
// kernel (which may be a template-id with commas) names it in reports.
#define CUDA_EMULATOR_LAUNCH(grid, block, shared, stream, ...)               \
  ::syncnorm::emu::Configure(#__VA_ARGS__, __VA_ARGS__, grid, block, shared, \
                             stream)

namespace syncnorm::emu {

// The running block's storage of the __shared__ variable declared at
// file:line: made on its first use in each block, every byte 0xff (a NaN
// in every floating type), the same for every thread of the block.
void* SharedStorage(const char* file, int line, size_t bytes, size_t align);

template <typename T>
T& SharedVariable(const char* file, int line) {
  static_assert(std::is_trivially_destructible_v<T>,
                "__shared__ variables have trivial types");
  return *static_cast<T*>(SharedStorage(file, line, sizeof(T), alignof(T)));
}

}  // namespace syncnorm::emu

#define __syncthreads() ::syncnorm::emu::SyncThreads(__FILE__, __LINE__)
#define __syncwarp(...) \
  ::syncnorm::emu::SyncWarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_down_sync(mask, value, ...)                                 \
  ::syncnorm::emu::ShuffleValue(__FILE__, __LINE__,                        \
                                ::syncnorm::emu::ShuffleKind::kDown, mask, \
                                value, __VA_ARGS__)
#define __shfl_up_sync(mask, value, ...)                                 \
  ::syncnorm::emu::ShuffleValue(__FILE__, __LINE__,                      \
                                ::syncnorm::emu::ShuffleKind::kUp, mask, \
                                value, __VA_ARGS__)
#define __shfl_xor_sync(mask, value, ...)                                 \
  ::syncnorm::emu::ShuffleValue(__FILE__, __LINE__,                       \
                                ::syncnorm::emu::ShuffleKind::kXor, mask, \
                                value, __VA_ARGS__)
#define __shfl_sync(mask, value, ...)                                       \
  ::syncnorm::emu::ShuffleValue(__FILE__, __LINE__,                         \
                                ::syncnorm::emu::ShuffleKind::kIndex, mask, \
                                value, __VA_ARGS__)

inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<uint64_t>(a) * b) >> 32);
}

#endif  // SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_RUNTIME_H_
