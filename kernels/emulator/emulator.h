// A strict CPU emulator of the CUDA device that the project's kernels
// (kernels/*.cu) run on in CI, where there is no GPU. The .cu sources
// compile unchanged as host C++ against the emulator's cuda_runtime.h,
// cuda_fp16.h and cuda_bf16.h (kernels/emulator/include); this header is
// the tests' control panel.
//
// What the emulator enforces, and how each violation is reported:
//  - Each CUDA thread of a block runs as its own fiber. __syncthreads is a
//    true block barrier: every thread of the block must reach the same
//    __syncthreads; a thread that exits or waits elsewhere instead is a
//    deadlock. Thread order varies between barrier phases (forward,
//    reverse), so code that reads shared data without a barrier sees
//    another thread's stale or unwritten (NaN) values.
//  - __shfl_*_sync and __syncwarp are a rendezvous of the lanes in their
//    mask: the caller must be in its mask, every lane of the mask must take
//    part at the same call site with the same mask, and a lane may read
//    only a lane of the mask.
//  - __shared__ variables are per block and poisoned (every byte 0xff, a
//    NaN in every floating type) before each block runs.
//  - Device memory (cudaMalloc, memory pools) sits between guard pages
//    (an access outside it faults) and starts out as NaN bytes; the bytes
//    between its end and the next 16-byte boundary are checked unchanged
//    when it is freed.
//  - Launches are checked against the device's limits (block and grid
//    dimensions, threads and shared memory per block), and each pointer
//    argument must point into device memory of the launch's device.
//  - Streams are queues that run only when the host synchronizes with them
//    (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a
//    synchronous copy, cudaFree): a query never makes progress (unless
//    Config::queries_run_work), so work the host does not wait for has not
//    happened. Copies from pinned host
//    memory read it when they run, copies from pageable memory when they
//    are queued (as CUDA stages them).
// A fault in a kernel (deadlock, shuffle misuse, illegal address) makes the
// error sticky, as on a GPU: every later call returns it, and
// cudaGetErrorString describes the fault (kernel, block, thread, call
// site). Reset clears it.
//
// Thread-safe: one lock serializes the runtime, and kernels run one block
// at a time under it.
#ifndef SYNCNORM_KERNELS_EMULATOR_EMULATOR_H_
#define SYNCNORM_KERNELS_EMULATOR_EMULATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace syncnorm::emu {

// The emulated machine.
struct Config {
  // Visible devices; 0 makes cudaGetDeviceCount fail with cudaErrorNoDevice.
  int devices = 1;
  // false: every call fails with cudaErrorInsufficientDriver, as on a
  // machine without an NVIDIA driver.
  bool driver = true;
  // Multiprocessors per device (cudaDevAttrMultiProcessorCount). Small by
  // default so that grid-stride loops of modest tensors iterate.
  int multiprocessors = 2;
  // cudaDevAttrMemoryPoolsSupported; false: cudaMallocAsync and the
  // cudaMemPool* calls fail with cudaErrorNotSupported (vGPUs, some
  // sandboxes).
  bool memory_pools = true;
  // Shared memory per block in bytes (static and dynamic together).
  int shared_memory_per_block = 48 * 1024;
  // Reported L2 size in bytes.
  int l2_bytes = 50 * 1024 * 1024;
  // true: cudaStreamQuery and cudaEventQuery first run the queued work (a
  // fast GPU), for code that polls instead of waiting; false (default):
  // a query never makes progress.
  bool queries_run_work = false;
};

// Restarts the emulator with `config`: every allocation, stream, event and
// pool is released, the sticky error, the counters and the current device
// (0) of the calling thread are reset. REQUIRES: nothing else uses the
// emulator while it runs.
void Reset(const Config& config = Config{});

// What the runtime did since the last Reset.
struct Counters {
  int64_t launches = 0;
  int64_t blocks = 0;
  int64_t threads = 0;
  int64_t device_mallocs = 0;  // cudaMalloc
  int64_t async_mallocs = 0;   // cudaMallocAsync, cudaMallocFromPoolAsync
  int64_t pinned_allocs = 0;   // cudaMallocHost, cudaHostAlloc
  int64_t pools_created = 0;   // cudaMemPoolCreate
  // Copies between the device and pageable host memory: each is a host
  // synchronization on a GPU (the copy is staged, or waited for).
  int64_t pageable_uploads = 0;
  int64_t pageable_downloads = 0;
  int64_t synchronizations = 0;  // calls that ran the queued work
};
Counters GetCounters();

// The memory pools created with cudaMemPoolCreate, in creation order.
struct PoolInfo {
  int device = 0;
  uint64_t release_threshold = 0;
  int64_t allocations = 0;
};
std::vector<PoolInfo> Pools();

// The description of the sticky fault, "" when there is none.
std::string Fault();

}  // namespace syncnorm::emu

#endif  // SYNCNORM_KERNELS_EMULATOR_EMULATOR_H_
