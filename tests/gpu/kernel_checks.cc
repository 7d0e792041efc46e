// The device check's kernel checks on a real GPU (see checks.h).
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_runner.h"
#include "kernels/kernel_check.h"
#include "tests/gpu/checks.h"

namespace syncnorm::device_check {
namespace {

std::string Msg(const cuda::Result& r) { return r.ok() ? "" : r.message; }

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Whether device 0's primary context is active, through the driver API
// (loaded at run time: the check links no libcuda). -1: cannot tell.
int PrimaryContextActive() {
  static void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == nullptr) return -1;
  using Init = int (*)(unsigned);
  using Get = int (*)(int*, int);
  using State = int (*)(int, unsigned*, int*);
  auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  auto get = reinterpret_cast<Get>(dlsym(driver, "cuDeviceGet"));
  auto state =
      reinterpret_cast<State>(dlsym(driver, "cuDevicePrimaryCtxGetState"));
  int device = 0, active = 0;
  unsigned flags = 0;
  if (init == nullptr || get == nullptr || state == nullptr || init(0) != 0 ||
      get(&device, 0) != 0 || state(device, &flags, &active) != 0) {
    return -1;
  }
  return active;
}

// The probe the Python package makes before it picks a device
// (KernelsAvailable counts devices): no context appears. Then the old
// probe, a host pointer through LocalMoments, as the control.
int CheckProbeMakesNoContext() {
  int failed = 0;
  const int devices = cuda::VisibleDevices(nullptr);
  const int after_probe = PrimaryContextActive();
  failed += Report(devices > 0 && after_probe == 0,
                   "counting devices (the Python supports() probe) creates "
                   "no CUDA context",
                   "primary context active: " + std::to_string(after_probe));
  std::vector<float> host(4, 1.0f);
  std::vector<double> mean(1), m2(1);
  cuda::LocalMoments(nullptr, DType::kFloat32, host.data(), Geometry{4, 1, 1},
                     mean.data(), m2.data());
  const int after_old = PrimaryContextActive();
  failed += Report(after_old == 1,
                   "control: the old probe (a host pointer through "
                   "LocalMoments) does create one, so the check can see it",
                   "primary context active: " + std::to_string(after_old));
  return failed;
}

int CheckSweep(uint64_t seed) {
  int failed = 0;
  struct Sweep {
    const char* name;
    std::vector<check::Layout> layouts;
    bool misalign;
  };
  std::vector<check::Layout> unaligned = {
      {{4, 6, 70, 70}, false}, {{2, 33, 40}, false}, {{2, 7, 7, 300}, true}};
  for (const Sweep& s :
       {Sweep{"standard layouts (millions of elements)",
              check::StandardLayouts(/*large=*/true), false},
        Sweep{"odd shapes (C = 1..65536, inner 1..40000, empty batches)",
              check::OddLayouts(), false},
        Sweep{"tensors 4 bytes past 16-byte alignment", unaligned, true}}) {
    check::CudaRunner runner(s.misalign);
    check::Accuracy worst;
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> f = check::CheckKernels(
        runner, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, s.layouts,
        check::GpuTolerance(), seed, &worst);
    for (const std::string& e : runner.errors()) f.push_back(e);
    for (size_t i = 0; i < f.size() && i < 20; ++i) {
      std::printf("  %s\n", f[i].c_str());
    }
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "%zu layouts x 3 dtypes, every option, %.1f s; worst error "
                  "(units of GpuTolerance's fields): stats %.2g, sums %.2g, "
                  "elementwise %.2g",
                  s.layouts.size(), Seconds(start), worst.stats, worst.sums,
                  worst.out);
    failed +=
        Report(f.empty(), std::string("kernels vs float64: ") + s.name, detail);
  }
  return failed;
}

// A batch item of 2^31 + 16 float16 elements ([1, 2, 2^30 + 8]): statistics
// known in closed form, and the forward's output sampled around every
// boundary of 32-bit indexing.
int CheckHugeItem() {
  constexpr int64_t kInner = (int64_t{1} << 30) + 8;
  const Geometry g{1, 2, kInner};
  const size_t bytes = static_cast<size_t>(g.elements()) * 2;
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  if (free_bytes < 2 * bytes + (size_t{1} << 30)) {
    std::printf(
        "SKIP a batch item of 2^31 + 16 elements: needs %zu GB free, "
        "%zu GB are\n",
        (2 * bytes >> 30) + 1, free_bytes >> 30);
    return 0;
  }
  void* x = nullptr;
  void* y = nullptr;
  cudaMalloc(&x, bytes);
  cudaMalloc(&y, bytes);
  int failed = 0;
  const auto start = std::chrono::steady_clock::now();
  const int fill = FillHugeItem(x, kInner);
  std::vector<double> mean(2), m2(2);
  const cuda::Result moments = cuda::LocalMoments(nullptr, DType::kFloat16, x,
                                                  g, mean.data(), m2.data());
  const double n = static_cast<double>(kInner);
  failed += Report(fill == 0 && moments.ok() && mean[0] == 3.0 && m2[0] == n &&
                       mean[1] == 0.5 && m2[1] == 0.0,
                   "LocalMoments of a batch item of 2^31 + 16 elements",
                   Msg(moments) + " mean " + std::to_string(mean[0]) + " " +
                       std::to_string(mean[1]) + ", m2 " +
                       std::to_string(m2[0]) + " " + std::to_string(m2[1]));
  const std::vector<double> one = {1.0, 1.0};
  ForwardArgs f;
  f.x = x;
  f.y = y;
  f.mean = mean.data();
  f.invstd = one.data();
  const cuda::Result forward = cuda::Forward(nullptr, DType::kFloat16, g, f);
  // y = +-1 (channel 0) and 0 (channel 1), sampled at 32-bit boundaries.
  bool ok = forward.ok() && cudaDeviceSynchronize() == cudaSuccess;
  std::string bad;
  for (int64_t at : {int64_t{0}, kInner - 2, kInner, (int64_t{1} << 31) - 2,
                     (int64_t{1} << 31) + 2, 2 * kInner - 4}) {
    uint16_t h[4] = {};
    ok = ok && cudaMemcpy(h, static_cast<char*>(y) + 2 * at, sizeof(h),
                          cudaMemcpyDeviceToHost) == cudaSuccess;
    for (int k = 0; k < 4; ++k) {
      const int64_t i = at + k;
      const uint16_t want =
          i < kInner ? ((i & 1) ? 0x3c00 : 0xbc00) : 0x0000;  // +1, -1, +0
      if (h[k] != want) {
        ok = false;
        bad += " y[" + std::to_string(i) + "]=" + std::to_string(h[k]);
      }
    }
  }
  failed += Report(
      ok, "Forward over a batch item of 2^31 + 16 elements",
      Msg(forward) + bad + " (" + std::to_string(Seconds(start)) + " s)");
  cudaFree(x);
  cudaFree(y);
  return failed;
}

// The launchers' contract on a real device.
int CheckContract() {
  int failed = 0;
  check::CudaRunner runner;
  std::vector<float> host(24, 1.0f);
  std::vector<double> mean(3), m2(3);
  const Geometry g{2, 3, 4};
  cuda::Result r = cuda::LocalMoments(runner.stream(), DType::kFloat32,
                                      host.data(), g, mean.data(), m2.data());
  failed += Report(r.code == cuda::Code::kInvalidArgument &&
                       r.message.find("host memory") != std::string::npos,
                   "a host pointer is INVALID_ARGUMENT", r.message);
  r = cuda::LocalMoments(runner.stream(), static_cast<DType>(9), host.data(), g,
                         mean.data(), m2.data());
  failed += Report(r.code == cuda::Code::kInvalidArgument,
                   "an unknown dtype is INVALID_ARGUMENT", r.message);
  // Determinism: the same input twice, and a misaligned copy, give the
  // same bits.
  const check::Layout l{{32, 64, 56, 56}, false};
  std::vector<double> v(l.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 100.0 + (i * 7919 % 1013) / 9.0;
  const std::vector<uint8_t> bytes = check::Encode(DType::kBFloat16, v);
  check::CudaRunner shifted(/*misalign=*/true);
  void* x = runner.Upload(bytes);
  void* xs = shifted.Upload(bytes);
  std::vector<double> a1(64), b1(64), a2(64), b2(64), a3(64), b3(64);
  const bool ok =
      runner.Moments(DType::kBFloat16, x, l.geometry(), a1.data(), b1.data())
          .empty() &&
      runner.Moments(DType::kBFloat16, x, l.geometry(), a2.data(), b2.data())
          .empty() &&
      shifted.Moments(DType::kBFloat16, xs, l.geometry(), a3.data(), b3.data())
          .empty();
  failed += Report(ok && a1 == a2 && b1 == b2 && a1 == a3 && b1 == b3,
                   "LocalMoments is bitwise deterministic, aligned or not", "");
  // Forward never waits for the stream: queued behind 32 GiB of memset
  // work (about 10 ms on a large GPU), it returns while the stream is
  // still busy.
  void* big = nullptr;
  cudaMalloc(&big, size_t{1} << 30);
  for (int i = 0; i < 32; ++i) {
    cudaMemsetAsync(big, i, size_t{1} << 30, runner.stream());
  }
  std::vector<double> mean64(64, 1.0), invstd(64, 0.5);
  void* y = runner.Upload(bytes);
  ForwardArgs f;
  f.x = x;
  f.y = y;
  f.mean = mean64.data();
  f.invstd = invstd.data();
  const auto start = std::chrono::steady_clock::now();
  const cuda::Result fr =
      cuda::Forward(runner.stream(), DType::kBFloat16, l.geometry(), f);
  const double host_us = Seconds(start) * 1e6;
  const bool busy = cudaStreamQuery(runner.stream()) == cudaErrorNotReady;
  cudaGetLastError();
  failed +=
      Report(fr.ok() && busy,
             "Forward returns without waiting for the stream "
             "(coefficients go up through pinned memory)",
             Msg(fr) + " host time " + std::to_string(host_us) +
                 " us, stream still busy after: " + (busy ? "yes" : "no"));
  cudaStreamSynchronize(runner.stream());
  int pools = 0;
  cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0);
  std::printf("INFO scratch memory: %s\n",
              pools ? "syncnorm's own memory pool (the device has pools)"
                    : "cached cudaMalloc blocks (the device has no pools)");
  cudaFree(big);
  runner.Free(x);
  runner.Free(y);
  shifted.Free(xs);
  return failed;
}

}  // namespace

int RunKernelChecks(uint64_t seed) {
  int failed = CheckProbeMakesNoContext();
  failed += CheckSweep(seed);
  failed += CheckHugeItem();
  failed += CheckContract();
  return failed;
}

}  // namespace syncnorm::device_check
