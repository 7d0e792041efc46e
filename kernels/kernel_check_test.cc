// The CPU kernels, every dtype (float32, float16, bfloat16), against the
// float64 references of kernel_check.h.
#include "kernels/kernel_check.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm.h"
#include "kernels/moments.h"
#include "kernels/public_api_runner.h"
#include "kernels/thread_pool.h"

namespace syncnorm {
namespace {

// Runs the public API on the CPU; tensors are host copies.
class CpuRunner : public check::PublicApiRunner {
 public:
  explicit CpuRunner(ThreadPool* pool) { ctx_.pool = pool; }

  void* Upload(const std::vector<uint8_t>& bytes) override {
    if (bytes.empty()) return nullptr;
    void* p = std::malloc(bytes.size());
    std::memcpy(p, bytes.data(), bytes.size());
    return p;
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) override {
    std::vector<uint8_t> out(bytes);
    if (bytes > 0) std::memcpy(out.data(), p, bytes);
    return out;
  }
  void Free(void* p) override { std::free(p); }
};

void ExpectNoFailures(const std::vector<std::string>& failures) {
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

TEST(CpuKernelCheck, EveryDTypeLayoutAndOptionMatchesFloat64) {
  CpuRunner runner(nullptr);
  ExpectNoFailures(check::CheckKernels(
      runner, {DType::kFloat32, DType::kFloat16, DType::kBFloat16},
      check::StandardLayouts(/*large=*/false), check::CpuTolerance(),
      /*seed=*/1000));
}

TEST(CpuKernelCheck, HalfTypesOnAThreadPool) {
  ThreadPool pool(3);
  CpuRunner runner(&pool);
  ExpectNoFailures(check::CheckKernels(
      runner, {DType::kFloat16, DType::kBFloat16},
      check::StandardLayouts(/*large=*/false), check::CpuTolerance(),
      /*seed=*/2000));
}

}  // namespace
}  // namespace syncnorm
