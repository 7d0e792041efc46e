// The standalone device check (built by tests/gpu/device_check.sh with
// nvcc alone: no Bazel, no Abseil, no gRPC); checks.h says what each mode
// checks.
//
// Usage: device_check MODE [options]
//   self-test                 CPU only: the checker itself (no GPU needed)
//   kernels [--seed=N]        the CUDA kernels on the GPU
//   nccl                      NCCL ranks as threads, one per GPU
//   nccl-rank --rank=R --id-file=PATH [--die]
//                             one rank of the two-process NCCL check
// Prints one PASS/FAIL line per check. Exit status: 0 all passed, 1 a check
// failed, 2 no usable GPU, 3 built without NCCL, 64 bad usage.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/batch_norm_cuda.h"
#include "tests/gpu/checks.h"

namespace syncnorm::device_check {

int Report(bool ok, const std::string& name, const std::string& detail) {
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(),
              detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace syncnorm::device_check

namespace {

// The value of --name=value, or "".
std::string Flag(int argc, char** argv, const char* name) {
  const size_t n = std::strlen(name);
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
      return argv[i] + n + 1;
    }
  }
  return "";
}

bool Has(int argc, char** argv, const char* name) {
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

int Finish(int failures) {
  std::printf("device_check: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace syncnorm;  // NOLINT
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "self-test") return Finish(device_check::RunSelfTest());
  if (mode != "kernels" && mode != "nccl" && mode != "nccl-rank") {
    std::fprintf(stderr,
                 "usage: %s self-test | kernels [--seed=N] | nccl | "
                 "nccl-rank --rank=R --id-file=PATH [--die]\n",
                 argv[0]);
    return 64;
  }
  // No CUDA call before this one: the kernel checks look for a context.
  std::string why;
  const int gpus = cuda::VisibleDevices(&why);
  if (gpus == 0) {
    std::printf("no CUDA device: %s\n", why.c_str());
    return 2;
  }
  if (mode == "kernels") {
    const std::string seed_flag = Flag(argc, argv, "--seed");
    const uint64_t seed =
        seed_flag.empty()
            ? static_cast<uint64_t>(
                  std::chrono::system_clock::now().time_since_epoch().count() %
                  1000000007)
            : std::strtoull(seed_flag.c_str(), nullptr, 10);
    std::printf("device_check kernels: %d GPU(s), seed %llu\n", gpus,
                static_cast<unsigned long long>(seed));
    const int failures = device_check::RunKernelChecks(seed);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("INFO device 0: %s (sm_%d%d), %d SMs, L2 %d MB\n", prop.name,
                prop.major, prop.minor, prop.multiProcessorCount,
                prop.l2CacheSize >> 20);
    return Finish(failures);
  }
#ifndef SYNCNORM_WITH_NCCL
  std::printf("built without NCCL (no nccl.h was found)\n");
  return 3;
#else
  if (mode == "nccl") return Finish(device_check::RunNcclThreadChecks(gpus));
  const std::string rank = Flag(argc, argv, "--rank");
  const std::string id_file = Flag(argc, argv, "--id-file");
  if ((rank != "0" && rank != "1") || id_file.empty()) {
    std::fprintf(stderr, "nccl-rank needs --rank=0|1 and --id-file=PATH\n");
    return 64;
  }
  return Finish(device_check::RunNcclRank(rank == "1" ? 1 : 0, id_file,
                                          Has(argc, argv, "--die")));
#endif
}
