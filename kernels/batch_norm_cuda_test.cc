// The CUDA kernels through the public API (Device::kCuda): every dtype,
// layout and option against float64 references (kernel_check.h), plus the
// CUDA-specific contract. Tests that need a GPU skip, printing why, where
// none is visible (as on CI's machine, where the runtime reports "driver
// version is insufficient"); the test still links every CUDA kernel there.
#include "kernels/batch_norm_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm.h"
#include "kernels/kernel_check.h"
#include "kernels/moments.h"
#include "kernels/public_api_runner.h"

namespace syncnorm {
namespace {

// Whether a GPU is usable; prints the skip message once when not.
bool HaveDevice() {
  std::string why;
  if (cuda::VisibleDevices(&why) > 0) return true;
  std::printf("SKIPPED: no CUDA device visible (%s)\n", why.c_str());
  return false;
}

#define SKIP_WITHOUT_GPU()                               \
  do {                                                   \
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

class CudaRunner : public check::PublicApiRunner {
 public:
  CudaRunner() {
    ctx_.device = Device::kCuda;
    cudaStreamCreate(&stream_);
    ctx_.stream = stream_;
  }
  ~CudaRunner() override { cudaStreamDestroy(stream_); }

  void* Upload(const std::vector<uint8_t>& bytes) override {
    if (bytes.empty()) return nullptr;
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    return p;
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) override {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return out;
  }
  void Free(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

TEST(CudaKernelCheck, EveryDTypeLayoutAndOptionMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  CudaRunner runner;
  for (const std::string& f : check::CheckKernels(
           runner, {DType::kFloat32, DType::kFloat16, DType::kBFloat16},
           check::StandardLayouts(/*large=*/true), check::GpuTolerance(),
           /*seed=*/3000)) {
    ADD_FAILURE() << f;
  }
}

TEST(CudaKernelCheck, ReductionsAreBitwiseDeterministic) {
  SKIP_WITHOUT_GPU();
  CudaRunner runner;
  const check::Layout l{{16, 48, 33, 33}, false};
  std::vector<double> values(l.size());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = (i * 7919 % 1000) / 7.0;
  void* x = runner.Upload(check::Encode(DType::kFloat16, values));
  std::vector<double> mean1(l.c()), m21(l.c()), mean2(l.c()), m22(l.c());
  EXPECT_EQ(runner.Moments(DType::kFloat16, x, l.geometry(), mean1.data(),
                           m21.data()),
            "");
  EXPECT_EQ(runner.Moments(DType::kFloat16, x, l.geometry(), mean2.data(),
                           m22.data()),
            "");
  EXPECT_EQ(mean1, mean2);
  EXPECT_EQ(m21, m22);
  runner.Free(x);
}

TEST(CudaContract, HostPointersAreRejected) {
  SKIP_WITHOUT_GPU();
  std::vector<float> host(24, 1.0f);
  const Geometry g{2, 3, 4};
  KernelContext ctx;
  ctx.device = Device::kCuda;
  Moments m;
  absl::Status s = LocalMoments(ctx, DType::kFloat32, host.data(), g, &m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("host memory"), std::string::npos) << s;
}

// The probe the Python package asks before it picks a device: it counts
// devices and nothing else (tests/gpu/device_check.sh shows on a GPU that
// it creates no CUDA context).
TEST(CudaContract, KernelsAvailableCountsDevices) {
  EXPECT_TRUE(KernelsAvailable(Device::kCpu, DType::kBFloat16));
  EXPECT_FALSE(KernelsAvailable(Device::kCpu, static_cast<DType>(7)));
  EXPECT_FALSE(KernelsAvailable(static_cast<Device>(5), DType::kFloat32));
  EXPECT_EQ(KernelsAvailable(Device::kCuda, DType::kFloat16),
            cuda::VisibleDevices(nullptr) > 0);
}

// Runs everywhere: without a device the CUDA path fails clearly, never
// crashes, and writes nothing.
TEST(CudaContract, NoDeviceIsAClearFailedPrecondition) {
  if (cuda::VisibleDevices(nullptr) > 0) GTEST_SKIP() << "a GPU is visible";
  std::vector<float> host(24, 1.0f), out(24, -7.0f);
  const Geometry g{2, 3, 4};
  KernelContext ctx;
  ctx.device = Device::kCuda;
  Moments m;
  absl::Status s = LocalMoments(ctx, DType::kFloat16, host.data(), g, &m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s;
  std::vector<double> mean(3, 0.0), invstd(3, 1.0);
  ForwardArgs f;
  f.x = host.data();
  f.y = out.data();
  f.mean = mean.data();
  f.invstd = invstd.data();
  s = Forward(ctx, DType::kFloat32, g, f);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(out, std::vector<float>(24, -7.0f));
}

}  // namespace
}  // namespace syncnorm
