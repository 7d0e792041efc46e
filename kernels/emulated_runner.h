// The CUDA kernels' raw launchers (batch_norm_cuda.h) on the CPU emulator
// (kernels/emulator), as a check::KernelRunner, and the shapes the emulated
// tests sweep. Test-only; used by //kernels:cuda_emulated_test and the
// planted-bug binaries it runs.
#ifndef SYNCNORM_KERNELS_EMULATED_RUNNER_H_
#define SYNCNORM_KERNELS_EMULATED_RUNNER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/emulator/emulator.h"
#include "kernels/kernel_check.h"

namespace syncnorm::check {

class EmulatedRunner : public KernelRunner {
 public:
  // misalign: tensors start 4 bytes past a 16-byte boundary, so that the
  // kernels cannot use vector loads.
  explicit EmulatedRunner(bool misalign = false) : misalign_(misalign) {
    Check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~EmulatedRunner() override { cudaStreamDestroy(stream_); }

  std::string Moments(DType d, const void* x, const Geometry& g, double* mean,
                      double* m2) override {
    return Message(cuda::LocalMoments(stream_, d, x, g, mean, m2));
  }
  std::string Forward(DType d, const Geometry& g,
                      const ForwardArgs& a) override {
    return Message(cuda::Forward(stream_, d, g, a));
  }
  std::string BackwardReduce(DType d, const Geometry& g,
                             const BackwardReduceArgs& a, double* sum_dy,
                             double* sum_dy_xmu) override {
    return Message(cuda::BackwardReduce(stream_, d, g, a, sum_dy, sum_dy_xmu));
  }
  std::string BackwardElementwise(DType d, const Geometry& g,
                                  const BackwardElementwiseArgs& a) override {
    return Message(cuda::BackwardElementwise(stream_, d, g, a));
  }

  void* Upload(const std::vector<uint8_t>& bytes) override {
    if (bytes.empty()) return nullptr;
    const size_t skip = misalign_ ? 4 : 0;
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes.size() + skip), "cudaMalloc");
    char* base = static_cast<char*>(p) + skip;
    Check(cudaMemcpy(base, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
          "upload");
    ++uploads_;
    return base;
  }
  // Waits for the stream first: a fault of a queued kernel shows here.
  std::vector<uint8_t> Download(const void* p, size_t bytes) override {
    std::vector<uint8_t> out(bytes);
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (bytes > 0) {
      Check(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost),
            "download");
    }
    return out;
  }
  void Free(void* p) override {
    if (p == nullptr) return;
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Check(cudaFree(static_cast<char*>(p) - (misalign_ ? 4 : 0)), "cudaFree");
  }

  cudaStream_t stream() const { return stream_; }
  // cudaMalloc calls made by Upload.
  int64_t uploads() const { return uploads_; }
  // What went wrong outside the kernel calls (emulator faults included).
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  static std::string Message(const cuda::Result& r) {
    return r.ok() ? "" : r.message;
  }
  void Check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      errors_.push_back(std::string(what) + ": " + cudaGetErrorString(e));
    }
  }

  const bool misalign_;
  cudaStream_t stream_ = nullptr;
  int64_t uploads_ = 0;
  std::vector<std::string> errors_;
};

// The element bound of one elementwise launch in the emulated build
// (SYNCNORM_CUDA_SLICE_ELEMENTS), lowered so that batch items of a few
// hundred thousand elements take the paths of items over 2^31 elements.
constexpr int64_t kEmulatedSliceElements = 32768;

// The shapes the emulated sweep runs: ranks 2 to 5 in both layouts, empty
// batches, C = 1, 31, 33 and 65536, inner sizes from 1 to beyond the slice
// bound, rows that are sliced whole, by planes and within a plane, and
// tensors many grid strides long. Bounded so that the sweep of all three
// dtypes takes seconds on the emulator.
inline std::vector<Layout> EmulatedLayouts() {
  return {
      // 2-D: (N, C), channels-last by nature.
      {{7, 3}, false},
      {{300, 70}, false},
      {{5, 1}, false},
      {{1, 1}, false},
      {{2, 65536}, false},  // C = 65536; rows sliced by planes (of 1)
      // Channels-first: column reads (inner < 32), plane reads (>= 32).
      {{5, 4, 9}, false},
      {{3, 31, 1}, false},
      {{2, 33, 3}, false},
      {{2, 31, 3, 3, 3}, false},  // inner 27
      {{3, 5, 6, 7}, false},
      {{2, 33, 40}, false},     // inner 40: groups of 4 and 8 values
      {{3, 1, 9, 7}, false},    // inner 63: no whole groups
      {{4, 6, 70, 70}, false},  // many strides; rows sliced whole
      {{3, 65536, 2}, false},   // C = 65536, rows sliced by planes
      {{1, 2, 40000}, false},   // planes sliced within
      {{2, 3, 4, 5, 6}, false},
      // Channels-last.
      {{5, 9, 4}, true},
      {{64, 40, 3}, true},  // C = 3: warps read across rows
      {{8, 9, 31}, true},
      {{4, 8, 8, 33}, true},
      {{16, 16, 16, 1}, true},  // C = 1
      {{3, 6, 7, 5}, true},
      {{2, 4, 5, 6, 3}, true},
      {{2, 7, 7, 300}, true},
      // Empty batches.
      {{0, 3, 4}, false},
      {{0, 4, 3}, true},
      {{0, 65536}, false},
  };
}

}  // namespace syncnorm::check

#endif  // SYNCNORM_KERNELS_EMULATED_RUNNER_H_
