// The CUDA emulator's strictness, claim by claim (emulator.h), on small
// kernels: what it must compute, and each misuse it must report. Built like
// the project's kernels (prepare.sh), for the emulator only.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/emulator/emulator.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace syncnorm::emu {
namespace {

#define LAUNCH CUDA_EMULATOR_LAUNCH

// ---- kernels
// ------------------------------------------------------------------

// out[block] = sum of in[block * 64 + t] over a block of 64, by a shared
// tree with a barrier per level.
__global__ void BlockSum(const float* in, float* out) {
  __shared__ float part[64];
  const int t = threadIdx.x;
  part[t] = in[blockIdx.x * 64 + t];
  for (int step = 32; step > 0; step /= 2) {
    __syncthreads();
    if (t < step) part[t] += part[t + step];
  }
  if (t == 0) out[blockIdx.x] = part[0];
}

// Half the threads leave before the barrier the others wait at.
__global__ void ExitBeforeBarrier(float* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Two barriers, one per branch.
__global__ void BarriersInBranches(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

// out[k * 32 + lane] for k = down 3, up 5, xor 6, index (lane * 7) % 32,
// each within segments of `width` lanes.
__global__ void Shuffles(const int* in, int* out, int width) {
  const int lane = threadIdx.x;
  const int v = in[lane];
  out[lane] = __shfl_down_sync(0xffffffffu, v, 3, width);
  out[32 + lane] = __shfl_up_sync(0xffffffffu, v, 5, width);
  out[64 + lane] = __shfl_xor_sync(0xffffffffu, v, 6, width);
  out[96 + lane] = __shfl_sync(0xffffffffu, v, (lane * 7) % 32, width);
}

__global__ void MaskWithoutCaller(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0x7fffffffu, 1, 1);
}

// Lane 31 leaves; the others wait for it at a shuffle.
__global__ void LaneLeavesShuffle(int* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
}

// Odd and even lanes at different shuffles with the same mask.
__global__ void ShufflesInBranches(int* out) {
  int v = 0;
  if (threadIdx.x % 2 == 0) {
    v = __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, 2, 1);
  }
  out[threadIdx.x] = v;
}

// A full mask in a block of 48 threads: the second warp has 16 lanes.
__global__ void MaskBeyondBlock(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

// Each block reads its shared variable before any thread wrote it, then
// writes its block index there.
__global__ void SharedBeforeWrite(float* out) {
  __shared__ float cell[1];
  out[blockIdx.x] = cell[0];
  __syncthreads();
  cell[0] = static_cast<float>(blockIdx.x);
}

__global__ void TooMuchShared(char* out) {
  __shared__ char big[49 * 1024];
  big[threadIdx.x] = 1;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void CopyAt(const float* in, float* out, int at) {
  out[threadIdx.x] = in[at + static_cast<int>(threadIdx.x)];
}

__global__ void WriteAt(float* out, int at) { out[at] = 1.0f; }

__global__ void CopyThrough(float* const* in, float* out) { *out = **in; }

// ---- helpers
// ------------------------------------------------------------------

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <typename T>
T* DeviceArray(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> HostCopy(const T* device, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(
      cudaMemcpy(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return out;
}

// Runs what was launched; returns the (sticky) error.
cudaError_t Finish() { return cudaDeviceSynchronize(); }

// An illegal access is caught by a fault handler that jumps back into the
// emulator, which ThreadSanitizer cannot follow (it reports every call
// after the jump as made inside the handler).
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() GTEST_SKIP() << "ThreadSanitizer build"
#else
#define SKIP_UNDER_TSAN() \
  do {                    \
  } while (0)
#endif

class EmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(); }
  void TearDown() override { Reset(); }
};

// ---- what it computes
// ---------------------------------------------------------

TEST_F(EmulatorTest, BarriersAndSharedMemoryComputeABlockSum) {
  std::vector<float> in(3 * 64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 17);
  float* d_in = DeviceArray(in);
  float* d_out = DeviceArray(std::vector<float>(3, 0.0f));
  LAUNCH(3, 64, 0, nullptr, BlockSum)(d_in, d_out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(Finish(), cudaSuccess) << Fault();
  const std::vector<float> out = HostCopy(d_out, 3);
  for (int b = 0; b < 3; ++b) {
    float sum = 0;
    for (int t = 0; t < 64; ++t) sum += in[b * 64 + t];
    EXPECT_EQ(out[b], sum) << "block " << b;
  }
}

TEST_F(EmulatorTest, ShufflesMoveValuesAsCudaDefinesThem) {
  for (int width : {32, 16, 8}) {
    Reset();
    std::vector<int> in(32);
    for (int i = 0; i < 32; ++i) in[i] = 100 + i;
    int* d_in = DeviceArray(in);
    int* d_out = DeviceArray(std::vector<int>(128, -1));
    LAUNCH(1, 32, 0, nullptr, Shuffles)(d_in, d_out, width);
    ASSERT_EQ(Finish(), cudaSuccess) << Fault();
    const std::vector<int> out = HostCopy(d_out, 128);
    for (int lane = 0; lane < 32; ++lane) {
      const int base = lane / width * width, pos = lane % width;
      const int down = pos + 3 < width ? base + pos + 3 : lane;
      const int up = pos - 5 >= 0 ? base + pos - 5 : lane;
      const int x = (pos ^ 6) < width ? base + (pos ^ 6) : lane;
      const int idx = base + ((lane * 7) % 32) % width;
      EXPECT_EQ(out[lane], 100 + down) << "width " << width << " lane " << lane;
      EXPECT_EQ(out[32 + lane], 100 + up) << "width " << width;
      EXPECT_EQ(out[64 + lane], 100 + x) << "width " << width;
      EXPECT_EQ(out[96 + lane], 100 + idx) << "width " << width;
    }
  }
}

// ---- barriers
// -----------------------------------------------------------------

TEST_F(EmulatorTest, ABarrierSomeThreadsNeverReachIsADeadlock) {
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  LAUNCH(1, 32, 0, nullptr, ExitBeforeBarrier)(out);
  EXPECT_EQ(Finish(), cudaErrorLaunchTimeout);
  const std::string f = Fault();
  EXPECT_TRUE(Has(f, "deadlock")) << f;
  EXPECT_TRUE(Has(f, "threads 0-15 wait at __syncthreads")) << f;
  EXPECT_TRUE(Has(f, "threads 16-31 have exited")) << f;
  EXPECT_TRUE(Has(f, "ExitBeforeBarrier")) << f;
}

TEST_F(EmulatorTest, DifferentBarriersAreADeadlock) {
  float* out = DeviceArray(std::vector<float>(64, 0.0f));
  LAUNCH(1, 64, 0, nullptr, BarriersInBranches)(out);
  EXPECT_EQ(Finish(), cudaErrorLaunchTimeout);
  EXPECT_TRUE(Has(Fault(), "deadlock")) << Fault();
  EXPECT_TRUE(Has(Fault(), "emulator_test.cu")) << Fault();
}

// ---- warp calls
// ----------------------------------------------------------------

TEST_F(EmulatorTest, AMaskWithoutTheCallerIsRefused) {
  int* out = DeviceArray(std::vector<int>(32, 0));
  LAUNCH(1, 32, 0, nullptr, MaskWithoutCaller)(out);
  EXPECT_EQ(Finish(), cudaErrorIllegalInstruction);
  const std::string f = Fault();
  EXPECT_TRUE(Has(f, "__shfl_down_sync")) << f;
  EXPECT_TRUE(Has(f, "mask 0x7fffffff")) << f;
  EXPECT_TRUE(Has(f, "lane 31")) << f;
}

TEST_F(EmulatorTest, ALaneOfTheMaskThatLeavesIsADeadlock) {
  int* out = DeviceArray(std::vector<int>(32, 0));
  LAUNCH(1, 32, 0, nullptr, LaneLeavesShuffle)(out);
  EXPECT_EQ(Finish(), cudaErrorLaunchTimeout);
  const std::string f = Fault();
  EXPECT_TRUE(Has(f, "threads 0-30 wait at __shfl_down_sync")) << f;
  EXPECT_TRUE(Has(f, "threads 31 have exited")) << f;
}

TEST_F(EmulatorTest, LanesOfAMaskAtDifferentCallsAreRefused) {
  int* out = DeviceArray(std::vector<int>(32, 0));
  LAUNCH(1, 32, 0, nullptr, ShufflesInBranches)(out);
  EXPECT_EQ(Finish(), cudaErrorIllegalInstruction);
  EXPECT_TRUE(Has(Fault(), "every lane of a mask must take part")) << Fault();
}

TEST_F(EmulatorTest, AMaskNamingLanesTheBlockLacksIsRefused) {
  int* out = DeviceArray(std::vector<int>(48, 0));
  LAUNCH(1, 48, 0, nullptr, MaskBeyondBlock)(out);
  EXPECT_EQ(Finish(), cudaErrorIllegalInstruction);
  EXPECT_TRUE(Has(Fault(), "does not have")) << Fault();
}

// ---- memory
// ----------------------------------------------------------------------

TEST_F(EmulatorTest, SharedMemoryIsPerBlockAndStartsAsNaN) {
  float* out = DeviceArray(std::vector<float>(3, 0.0f));
  LAUNCH(3, 32, 0, nullptr, SharedBeforeWrite)(out);
  ASSERT_EQ(Finish(), cudaSuccess) << Fault();
  for (float v : HostCopy(out, 3)) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST_F(EmulatorTest, SharedMemoryBeyondTheLimitIsRefused) {
  char* out = DeviceArray(std::vector<char>(32, 0));
  LAUNCH(1, 32, 0, nullptr, TooMuchShared)(out);
  EXPECT_EQ(Finish(), cudaErrorLaunchFailure);
  EXPECT_TRUE(Has(Fault(), "exceed the 49152")) << Fault();
}

TEST_F(EmulatorTest, DeviceMemoryStartsAsNaN) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 16 * sizeof(float)), cudaSuccess);
  float* out = DeviceArray(std::vector<float>(16, 0.0f));
  LAUNCH(1, 16, 0, nullptr, CopyAt)(static_cast<float*>(p), out, 0);
  ASSERT_EQ(Finish(), cudaSuccess);
  for (float v : HostCopy(out, 16)) EXPECT_TRUE(std::isnan(v));
}

TEST_F(EmulatorTest, AReadPastTheEndHitsTheGuardPage) {
  SKIP_UNDER_TSAN();
  float* in = DeviceArray(std::vector<float>(1000, 1.0f));  // 4000 bytes
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  LAUNCH(1, 32, 0, nullptr, CopyAt)(in, out, 1000 - 31);  // reads in[1000]
  EXPECT_EQ(Finish(), cudaErrorIllegalAddress);
  const std::string f = Fault();
  EXPECT_TRUE(Has(f, "thread 31")) << f;
  EXPECT_TRUE(Has(f,
                  "0 bytes past the end of the device allocation of 4000 "
                  "bytes"))
      << f;
}

TEST_F(EmulatorTest, AReadBeforeTheStartHitsTheGuardPage) {
  SKIP_UNDER_TSAN();
  float* in = DeviceArray(std::vector<float>(1024, 1.0f));
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  LAUNCH(1, 32, 0, nullptr, CopyAt)(in, out, -1);
  EXPECT_EQ(Finish(), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(Fault(), "4 bytes before the device allocation")) << Fault();
}

// 4004 bytes: a write into the padding to the 16-byte boundary is caught
// when the memory is freed.
TEST_F(EmulatorTest, AWritePastTheEndIsCaughtAtFree) {
  float* p = DeviceArray(std::vector<float>(1001, 1.0f));
  LAUNCH(1, 1, 0, nullptr, WriteAt)(p, 1001);
  ASSERT_EQ(Finish(), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(Fault(), "a write past the end of the device allocation"))
      << Fault();
}

TEST_F(EmulatorTest, FreedMemoryIsGone) {
  float* in = DeviceArray(std::vector<float>(64, 1.0f));
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  ASSERT_EQ(cudaFree(in), cudaSuccess);
  float* again = DeviceArray(std::vector<float>(64, 1.0f));
  EXPECT_NE(again, in);  // freed memory stays unusable for a while
  LAUNCH(1, 32, 0, nullptr, CopyAt)(in, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(Fault(), "pointer argument 0")) << Fault();
  EXPECT_TRUE(Has(Fault(), "freed device allocation of 256 bytes")) << Fault();
}

// A kernel that holds on to freed memory (not through an argument) faults.
TEST_F(EmulatorTest, AnAccessToFreedMemoryFaults) {
  SKIP_UNDER_TSAN();
  float* in = DeviceArray(std::vector<float>(64, 1.0f));
  float* out = DeviceArray(std::vector<float>(1, 0.0f));
  float* stale[1] = {in};
  float** d_stale = DeviceArray(std::vector<float*>(stale, stale + 1));
  ASSERT_EQ(cudaFree(in), cudaSuccess);
  LAUNCH(1, 1, 0, nullptr, CopyThrough)(d_stale, out);
  EXPECT_EQ(Finish(), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(Fault(), "freed device allocation")) << Fault();
}

// After the fault handler jumps out of a CUDA thread's fiber, AddressSanitizer
// must know the thread is on its own stack again: LeakSanitizer scans that
// stack at exit, and the fiber's is gone by then (it crashed the leak check).
TEST_F(EmulatorTest, AFaultLeavesTheSanitizerOnTheThreadsOwnStack) {
#if !defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "asks AddressSanitizer; run under --config=asan";
#else
  float* in = DeviceArray(std::vector<float>(1000, 1.0f));
  float* out = DeviceArray(std::vector<float>(1000, 0.0f));
  LAUNCH(1, 32, 0, nullptr, CopyAt)(in, out, 990);  // thread 10+ reads past
  ASSERT_EQ(Finish(), cudaErrorIllegalAddress);
  // A switch to this same stack reports the stack ASan thought it was on.
  int here = 0;
  void* fake = nullptr;
  const void* bottom = nullptr;
  size_t bytes = 0;
  __sanitizer_start_switch_fiber(&fake, nullptr, 0);
  __sanitizer_finish_switch_fiber(fake, &bottom, &bytes);
  __sanitizer_start_switch_fiber(&fake, bottom, bytes);  // and back
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
  const auto* lo = static_cast<const char*>(bottom);
  const auto* p = reinterpret_cast<const char*>(&here);
  EXPECT_TRUE(p >= lo && p < lo + bytes)
      << "ASan's stack [" << bottom << ", +" << bytes << ") does not hold "
      << static_cast<const void*>(p);
#endif
}

TEST_F(EmulatorTest, HostPointersAreRefusedAtLaunch) {
  std::vector<float> host(32, 1.0f);
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  LAUNCH(1, 32, 0, nullptr, CopyAt)(host.data(), out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(Fault(), "not memory of device 0")) << Fault();
  // Sticky, as on a GPU: every later call fails the same way.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
  EXPECT_TRUE(Has(cudaGetErrorString(cudaErrorIllegalAddress), "CopyAt"));
}

TEST_F(EmulatorTest, MemoryOfAnotherDeviceIsRefusedAtLaunch) {
  Config config;
  config.devices = 2;
  Reset(config);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* in = DeviceArray(std::vector<float>(32, 1.0f));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* out = DeviceArray(std::vector<float>(32, 0.0f));
  LAUNCH(1, 32, 0, nullptr, CopyAt)(in, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
}

// ---- launch configurations -------------------------------------------------

TEST_F(EmulatorTest, LaunchesOutsideTheDeviceLimitsAreRefused) {
  float* out = DeviceArray(std::vector<float>(64, 0.0f));
  struct Bad {
    dim3 grid, block;
    size_t shared;
  };
  for (const Bad& bad :
       {Bad{1, 1025, 0}, Bad{1, dim3(1, 1, 65), 0}, Bad{dim3(1, 65536), 1, 0},
        Bad{0, 1, 0}, Bad{1, 1, 64 * 1024}}) {
    LAUNCH(bad.grid, bad.block, bad.shared, nullptr, WriteAt)(out, 0);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  }
  EXPECT_EQ(GetCounters().launches, 0);
  EXPECT_EQ(Fault(), "");  // not sticky
}

// ---- streams and copies
// ---------------------------------------------------------

TEST_F(EmulatorTest, QueuedWorkRunsOnlyWhenTheHostWaits) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* p = DeviceArray(std::vector<float>(1, 0.0f));
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  LAUNCH(1, 1, 0, s, WriteAt)(p, 0);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);  // recorded
  EXPECT_EQ(GetCounters().blocks, 0);
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(HostCopy(p, 1)[0], 1.0f);
}

// A copy from pinned memory reads it when it runs; from pageable memory,
// when it is queued.
TEST_F(EmulatorTest, PinnedCopiesReadTheHostWhenTheyRun) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4), cudaSuccess);
  float pageable = 1.0f;
  *pinned = 1.0f;
  float* a = DeviceArray(std::vector<float>(1, 0.0f));
  float* b = DeviceArray(std::vector<float>(1, 0.0f));
  ASSERT_EQ(cudaMemcpyAsync(a, pinned, 4, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, &pageable, 4, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  *pinned = 2.0f;
  pageable = 2.0f;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(HostCopy(a, 1)[0], 2.0f);
  EXPECT_EQ(HostCopy(b, 1)[0], 1.0f);
  EXPECT_EQ(GetCounters().pageable_uploads, 1 + 2 /* DeviceArray */);
}

TEST_F(EmulatorTest, MemoryPoolsCanBeMissing) {
  Config config;
  config.memory_pools = false;
  Reset(config);
  int supported = -1;
  ASSERT_EQ(
      cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0),
      cudaSuccess);
  EXPECT_EQ(supported, 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMallocAsync(&p, 64, nullptr), cudaErrorNotSupported);
  cudaMemPool_t pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  EXPECT_EQ(cudaMemPoolCreate(&pool, &props), cudaErrorNotSupported);
}

TEST_F(EmulatorTest, StreamOrderedFreesHappenInStreamOrder) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 64, s), cudaSuccess);
  LAUNCH(1, 1, 0, s, WriteAt)(static_cast<float*>(p), 0);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << Fault();
  float* out = DeviceArray(std::vector<float>(1, 0.0f));
  LAUNCH(1, 1, 0, s, CopyAt)(static_cast<float*>(p), out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
}

TEST_F(EmulatorTest, NoDeviceAndNoDriver) {
  Config config;
  config.devices = 0;
  Reset(config);
  int n = -1;
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaErrorNoDevice);
  config.driver = false;
  Reset(config);
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
  EXPECT_TRUE(Has(cudaGetErrorString(cudaErrorInsufficientDriver),
                  "driver version is insufficient"));
}

}  // namespace
}  // namespace syncnorm::emu
