// Scratch memory of the CUDA launchers (batch_norm_cuda_*.cu): device
// memory for partial results and per-channel inputs, and pinned host memory
// through which every upload and download goes (a copy from pageable
// memory can make the host wait for the stream).
//
// Device memory comes, per device, from syncnorm's own memory pool when
// the device has memory pools (probed once: cudaDevAttrMemoryPoolsSupported;
// the pool keeps what it was given, so nothing is unmapped and mapped again
// between calls), else from cached cudaMalloc blocks. Pinned host memory
// always comes from cached blocks. A cached block carries an event
// recorded on the stream of its last use and is handed out again only once
// that event has completed, so calls on any streams may share the caches
// and no call waits for another. The caches keep their blocks for the
// life of the process (at most the largest number of calls in flight at
// once); ReleaseScratch (batch_norm_cuda.h) frees them. Included by .cu
// files only; thread-safe.
#ifndef SYNCNORM_KERNELS_CUDA_MEMORY_CUH_
#define SYNCNORM_KERNELS_CUDA_MEMORY_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda_common.cuh"

namespace syncnorm {
namespace cuda {
namespace detail {

// A block of device or pinned host memory and the event that says its last
// use has completed.
struct CachedBlock {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaEvent_t done = nullptr;
};

// Blocks of one kind on one device, reused once their event completes.
class BlockCache {
 public:
  explicit BlockCache(bool pinned_host) : pinned_host_(pinned_host) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `bytes` bytes that nothing uses any more.
  cudaError_t Acquire(size_t bytes, CachedBlock* out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < idle_.size(); ++i) {
        if (idle_[i].bytes < bytes) continue;
        const cudaError_t e = cudaEventQuery(idle_[i].done);
        if (e == cudaErrorNotReady) {
          cudaGetLastError();  // "not ready" is no error: clear it
          continue;
        }
        if (e != cudaSuccess) return e;
        *out = idle_[i];
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        return cudaSuccess;
      }
    }
    // Powers of two from 4 KiB, so that blocks fit later calls too.
    size_t size = 4096;
    while (size < bytes) size *= 2;
    CachedBlock b;
    b.bytes = size;
    cudaError_t e =
        pinned_host_ ? cudaMallocHost(&b.ptr, size) : cudaMalloc(&b.ptr, size);
    if (e == cudaSuccess) {
      e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
      if (e != cudaSuccess) Free(b);
    }
    if (e == cudaSuccess) *out = b;
    return e;
  }

  // Gives the block back: it may be reused once the work queued on
  // `stream` so far has completed.
  cudaError_t Release(const CachedBlock& block, cudaStream_t stream) {
    const cudaError_t e = cudaEventRecord(block.done, stream);
    std::lock_guard<std::mutex> lock(mu_);
    if (e == cudaSuccess) {
      idle_.push_back(block);
    } else {
      leaked_.push_back(block);  // its last use is unknown: never reuse it
    }
    return e;
  }

  // Frees every idle block. REQUIRES: their work has completed (the caller
  // synchronized the device).
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CachedBlock& b : idle_) Free(b);
    idle_.clear();
  }

 private:
  void Free(const CachedBlock& b) {
    if (b.done != nullptr) cudaEventDestroy(b.done);
    if (b.ptr != nullptr) pinned_host_ ? cudaFreeHost(b.ptr) : cudaFree(b.ptr);
  }

  const bool pinned_host_;
  std::mutex mu_;
  std::vector<CachedBlock> idle_;
  std::vector<CachedBlock> leaked_;
};

// The scratch memory of one device.
class DeviceScratch {
 public:
  DeviceScratch() : device_blocks_(false), host_blocks_(true) {}

  // Probes memory-pool support once and makes syncnorm's pool: it keeps
  // all memory it was given (release threshold: unlimited), so the steady
  // state maps nothing. Without pools (or if making one fails), device
  // memory comes from cached cudaMalloc blocks.
  void Probe(int device) {
    std::call_once(probed_, [this, device] {
      int supported = 0;
      if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported,
                                 device) != cudaSuccess ||
          supported == 0) {
        cudaGetLastError();
        return;
      }
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      cudaMemPool_t pool = nullptr;
      uint64_t keep_all = std::numeric_limits<uint64_t>::max();
      if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
      if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                  &keep_all) != cudaSuccess) {
        cudaGetLastError();
        cudaMemPoolDestroy(pool);
        return;
      }
      pool_ = pool;
    });
  }

  cudaMemPool_t pool() const { return pool_; }
  BlockCache& device_blocks() { return device_blocks_; }
  BlockCache& host_blocks() { return host_blocks_; }

  // Frees the cached blocks and the pool. REQUIRES: the device is idle.
  void Clear() {
    device_blocks_.Clear();
    host_blocks_.Clear();
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  }

 private:
  std::once_flag probed_;
  cudaMemPool_t pool_ = nullptr;
  BlockCache device_blocks_;
  BlockCache host_blocks_;
};

// The scratch of every device, made on first use.
class ScratchRegistry {
 public:
  static ScratchRegistry& Get() {
    // Never destroyed: CUDA may be torn down before static destructors.
    static ScratchRegistry* registry = new ScratchRegistry;
    return *registry;
  }

  DeviceScratch& ForDevice(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<DeviceScratch>& s = devices_[device];
    if (s == nullptr) s = std::make_unique<DeviceScratch>();
    return *s;
  }

  // Frees everything cached; the next call probes each device again.
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [device, s] : devices_) s->Clear();
    devices_.clear();
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<DeviceScratch>> devices_;
};

// The memory of one launcher call on `stream`: `device_bytes` of device
// scratch and `host_bytes` of pinned staging, aligned as cudaMalloc's
// (callers place records of at most 16-byte alignment in them). Released
// in stream order when the workspace goes out of scope: reused once the
// work queued on the stream by then has completed.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { Release(); }

  // INTERNAL (naming the launcher fn) when memory cannot be had.
  Result Reserve(const char* fn, size_t device_bytes, size_t host_bytes) {
    int device = 0;
    SYNCNORM_CUDA_TRY_NAMED(fn, cudaGetDevice(&device));
    scratch_ = &ScratchRegistry::Get().ForDevice(device);
    scratch_->Probe(device);
    if (device_bytes > 0) {
      if (scratch_->pool() != nullptr) {
        SYNCNORM_CUDA_TRY_NAMED(
            fn, cudaMallocFromPoolAsync(&pool_ptr_, device_bytes,
                                        scratch_->pool(), stream_));
        device_ = static_cast<char*>(pool_ptr_);
      } else {
        SYNCNORM_CUDA_TRY_NAMED(fn, scratch_->device_blocks().Acquire(
                                        device_bytes, &device_block_));
        device_ = static_cast<char*>(device_block_.ptr);
      }
    }
    if (host_bytes > 0) {
      SYNCNORM_CUDA_TRY_NAMED(
          fn, scratch_->host_blocks().Acquire(host_bytes, &host_block_));
      host_ = static_cast<char*>(host_block_.ptr);
    }
    return Result{};
  }

  char* device() const { return device_; }
  char* host() const { return host_; }
  cudaStream_t stream() const { return stream_; }

 private:
  void Release() {
    if (pool_ptr_ != nullptr) cudaFreeAsync(pool_ptr_, stream_);
    if (device_block_.ptr != nullptr) {
      scratch_->device_blocks().Release(device_block_, stream_);
    }
    if (host_block_.ptr != nullptr) {
      scratch_->host_blocks().Release(host_block_, stream_);
    }
  }

  const cudaStream_t stream_;
  DeviceScratch* scratch_ = nullptr;
  void* pool_ptr_ = nullptr;
  CachedBlock device_block_;
  CachedBlock host_block_;
  char* device_ = nullptr;
  char* host_ = nullptr;
};

}  // namespace detail
}  // namespace cuda
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CUDA_MEMORY_CUH_
