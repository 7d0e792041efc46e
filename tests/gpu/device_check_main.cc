// The standalone device check (built by tests/gpu/device_check.sh with nvcc
// alone: no Bazel, no Abseil, no gRPC). Runs every CUDA kernel for every
// dtype, layout and rank against float64 references on fresh random data
// (outputs poisoned first), checks the launchers' error paths and
// determinism, and exercises NCCL with the GPUs the machine has.
//
// Usage: device_check [--seed=N] [--no-nccl]. Exit 0: all passed; 1: a
// check failed; 2: no usable GPU.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/formulas.h"
#include "kernels/kernel_check.h"
#ifdef SYNCNORM_WITH_NCCL
#include "client/nccl_comm.h"
#endif

namespace syncnorm {
namespace {

int failures = 0;

void Report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::string Msg(const cuda::Result& r) { return r.ok() ? "" : r.message; }

// The raw launchers on a stream of their own; device memory via cudaMalloc.
class RawRunner : public check::KernelRunner {
 public:
  RawRunner() { cudaStreamCreate(&stream_); }
  ~RawRunner() override { cudaStreamDestroy(stream_); }
  std::string Moments(DType d, const void* x, const Geometry& g, double* mean,
                      double* m2) override {
    return Msg(cuda::LocalMoments(stream_, d, x, g, mean, m2));
  }
  std::string Forward(DType d, const Geometry& g,
                      const ForwardArgs& a) override {
    return Msg(cuda::Forward(stream_, d, g, a));
  }
  std::string BackwardReduce(DType d, const Geometry& g,
                             const BackwardReduceArgs& a, double* s1,
                             double* s2) override {
    return Msg(cuda::BackwardReduce(stream_, d, g, a, s1, s2));
  }
  std::string BackwardElementwise(DType d, const Geometry& g,
                                  const BackwardElementwiseArgs& a) override {
    return Msg(cuda::BackwardElementwise(stream_, d, g, a));
  }
  void* Upload(const std::vector<uint8_t>& bytes) override {
    if (bytes.empty()) return nullptr;
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes.size()), "cudaMalloc");
    Check(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
          "upload");
    return p;
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) override {
    std::vector<uint8_t> out(bytes);
    Check(cudaStreamSynchronize(stream_), "sync");
    if (bytes > 0) {
      Check(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost),
            "download");
    }
    return out;
  }
  void Free(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void* stream() const { return stream_; }

 private:
  static void Check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      std::printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
      ++failures;
    }
  }
  cudaStream_t stream_ = nullptr;
};

void CheckKernelSweep(uint64_t seed) {
  RawRunner runner;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> f = check::CheckKernels(
      runner, {DType::kFloat32, DType::kFloat16, DType::kBFloat16},
      check::StandardLayouts(/*large=*/true), check::GpuTolerance(), seed);
  for (const std::string& line : f) std::printf("  %s\n", line.c_str());
  const double s = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  Report(f.empty(), "kernels vs float64: 3 dtypes x " +
                        std::to_string(check::StandardLayouts(true).size()) +
                        " layouts, every option (" + std::to_string(s) +
                        " s)");
}

void CheckContract() {
  RawRunner runner;
  std::vector<float> host(24, 1.0f);
  std::vector<double> mean(3), m2(3);
  const Geometry g{2, 3, 4};
  cuda::Result r = cuda::LocalMoments(runner.stream(), DType::kFloat32,
                                      host.data(), g, mean.data(), m2.data());
  Report(r.code == cuda::Code::kInvalidArgument &&
             r.message.find("host memory") != std::string::npos,
         "a host pointer is rejected: " + r.message);
  r = cuda::LocalMoments(runner.stream(), static_cast<DType>(9), host.data(), g,
                         mean.data(), m2.data());
  Report(r.code == cuda::Code::kInvalidArgument, "unknown dtype: " + r.message);
  // Determinism: the same input twice gives the same bits.
  const check::Layout l{{32, 64, 56, 56}, false};
  std::vector<double> v(l.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 100.0 + (i * 7919 % 1013) / 9.0;
  void* x = runner.Upload(check::Encode(DType::kBFloat16, v));
  std::vector<double> a1(64), b1(64), a2(64), b2(64);
  const bool ok1 = runner.Moments(DType::kBFloat16, x, l.geometry(), a1.data(),
                                  b1.data()).empty();
  const bool ok2 = runner.Moments(DType::kBFloat16, x, l.geometry(), a2.data(),
                                  b2.data()).empty();
  runner.Free(x);
  Report(ok1 && ok2 && a1 == a2 && b1 == b2,
         "LocalMoments is bitwise deterministic");
}

#ifdef SYNCNORM_WITH_NCCL
// One NCCL round per visible GPU (threads): all-gather of per-rank moments
// folded in rank order (the same bits on every rank), all-reduce and
// broadcast, as NcclNodeGroup uses them.
void CheckNccl(int gpus) {
  std::string id;
  nccl::CommResult r = nccl::NewUniqueId(&id);
  if (!r.ok()) {
    Report(false, "ncclGetUniqueId: " + r.message);
    return;
  }
  constexpr int kC = 7;
  std::vector<std::vector<double>> merged(gpus), reduced(gpus), bcast(gpus);
  std::vector<std::string> errors(gpus);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < gpus; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<nccl::Comm> comm;
      nccl::CommResult c = nccl::Comm::Create(id, gpus, rank, rank, 60000, &comm);
      if (!c.ok()) {
        errors[rank] = c.message;
        return;
      }
      std::vector<double> send(1 + 2 * kC), all((1 + 2 * kC) * gpus);
      send[0] = rank == 1 ? 0 : 1000 + 17 * rank;  // rank 1: empty batch
      for (int ch = 0; ch < kC; ++ch) {
        send[1 + ch] = send[0] > 0 ? 0.1 * rank + ch : 0;
        send[1 + kC + ch] = send[0] > 0 ? 3.0 + rank * ch : 0;
      }
      c = comm->AllGather(send.data(), all.data(), send.size());
      if (c.ok()) {
        std::vector<double> m(2 * kC + 1, 0.0);
        for (int q = 0; q < gpus; ++q) {
          const double* p = all.data() + q * send.size();
          for (int ch = 0; ch < kC; ++ch) {
            double n = m[0];
            ChanMerge(n, m[1 + ch], m[1 + kC + ch], p[0], p[1 + ch],
                      p[1 + kC + ch]);
          }
          m[0] += p[0];
        }
        merged[rank] = m;
        reduced[rank].resize(kC);
        std::vector<double> mine(kC, 1.0 + rank);
        c = comm->AllReduceSum(mine.data(), reduced[rank].data(), kC);
      }
      if (c.ok()) {
        bcast[rank].assign(kC, rank == 0 ? 42.5 : -1.0);
        c = comm->Broadcast(bcast[rank].data(), kC * sizeof(double), 0);
      }
      if (!c.ok()) errors[rank] = c.message;
    });
  }
  for (std::thread& t : threads) t.join();
  bool ok = true;
  for (int rank = 0; rank < gpus; ++rank) {
    if (!errors[rank].empty()) {
      std::printf("  rank %d: %s\n", rank, errors[rank].c_str());
      ok = false;
      continue;
    }
    ok = ok && merged[rank] == merged[0];
    for (int ch = 0; ch < kC; ++ch) {
      ok = ok && reduced[rank][ch] == gpus + gpus * (gpus - 1) / 2.0;
      ok = ok && bcast[rank][ch] == 42.5;
    }
  }
  Report(ok, "NCCL with " + std::to_string(gpus) +
                 " rank(s): all-gather + rank-order merge identical on every "
                 "rank, all-reduce, broadcast");
}

// A communicator whose peer never comes fails within its timeout.
void CheckNcclTimeout(int gpus) {
  std::string id;
  nccl::NewUniqueId(&id);
  std::unique_ptr<nccl::Comm> comm;
  const auto start = std::chrono::steady_clock::now();
  nccl::CommResult r = nccl::Comm::Create(id, gpus + 1, 0, 0, 3000, &comm);
  const double s = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  Report(!r.ok() && s < 30, "NCCL init with a missing rank fails in " +
                                std::to_string(s) + " s: " + r.message);
}

// Two ranks on one GPU: NCCL refuses; the message says one rank per GPU.
void CheckNcclDuplicateGpu() {
  std::string id;
  nccl::NewUniqueId(&id);
  std::vector<nccl::CommResult> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<nccl::Comm> comm;
      results[rank] = nccl::Comm::Create(id, 2, rank, 0, 20000, &comm);
    });
  }
  for (std::thread& t : threads) t.join();
  const bool ok = !results[0].ok() && !results[1].ok();
  Report(ok, "two ranks on one GPU are refused: " +
                 (results[0].ok() ? std::string("(accepted!)")
                                  : results[0].message));
}
#endif  // SYNCNORM_WITH_NCCL

}  // namespace
}  // namespace syncnorm

int main(int argc, char** argv) {
  using namespace syncnorm;  // NOLINT
  uint64_t seed = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
  bool nccl = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--seed=", 7) == 0) seed = std::atoll(argv[i] + 7);
    if (std::strcmp(argv[i], "--no-nccl") == 0) nccl = false;
  }
  std::string why;
  const int gpus = cuda::VisibleDevices(&why);
  if (gpus == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device_check: %d GPU(s), device 0: %s (sm_%d%d), seed %llu\n",
              gpus, prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(seed));
  CheckKernelSweep(seed);
  CheckContract();
#ifdef SYNCNORM_WITH_NCCL
  if (nccl) {
    CheckNccl(gpus);
    CheckNcclTimeout(gpus);
    CheckNcclDuplicateGpu();
  }
#else
  if (nccl) std::printf("SKIPPED NCCL: built without nccl.h\n");
#endif
  std::printf("device_check: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
