// The CUDA kernels' raw launchers (batch_norm_cuda.h) as a
// check::KernelRunner, on a stream of their own with device memory from
// cudaMalloc: on a GPU (tests/gpu/device_check.sh builds it with nvcc) or
// on the CPU emulator (emulated_runner.h). Test-only.
#ifndef SYNCNORM_KERNELS_CUDA_RUNNER_H_
#define SYNCNORM_KERNELS_CUDA_RUNNER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/kernel_check.h"

namespace syncnorm::check {

class CudaRunner : public KernelRunner {
 public:
  // misalign: tensors start 4 bytes past a 16-byte boundary, so that the
  // kernels cannot use vector loads.
  explicit CudaRunner(bool misalign = false) : misalign_(misalign) {
    Check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~CudaRunner() override { cudaStreamDestroy(stream_); }

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

}  // namespace syncnorm::check

#endif  // SYNCNORM_KERNELS_CUDA_RUNNER_H_
