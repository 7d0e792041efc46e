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
#include "kernels/thread_pool.h"

namespace syncnorm {
namespace {

// Runs the public API on the CPU; tensors are host copies.
class CpuRunner : public check::KernelRunner {
 public:
  explicit CpuRunner(ThreadPool* pool) { ctx_.pool = pool; }

  std::string Moments(DType dtype, const void* x, const Geometry& g,
                      double* mean, double* m2) override {
    syncnorm::Moments m;
    absl::Status s = LocalMoments(ctx_, dtype, x, g, &m);
    if (!s.ok()) return s.ToString();
    if (m.count != g.per_channel()) return "wrong count";
    std::copy(m.mean.begin(), m.mean.end(), mean);
    std::copy(m.m2.begin(), m.m2.end(), m2);
    return "";
  }
  std::string Forward(DType dtype, const Geometry& g,
                      const ForwardArgs& args) override {
    return Message(syncnorm::Forward(ctx_, dtype, g, args));
  }
  std::string BackwardReduce(DType dtype, const Geometry& g,
                             const BackwardReduceArgs& args, double* sum_dy,
                             double* sum_dy_xmu) override {
    GradSums sums;
    absl::Status s =
        syncnorm::BackwardReduce(ctx_, dtype, g, args, &sums, nullptr, nullptr);
    if (!s.ok()) return s.ToString();
    std::copy(sums.sum_dy.begin(), sums.sum_dy.end(), sum_dy);
    std::copy(sums.sum_dy_xmu.begin(), sums.sum_dy_xmu.end(), sum_dy_xmu);
    return "";
  }
  std::string BackwardElementwise(
      DType dtype, const Geometry& g,
      const BackwardElementwiseArgs& args) override {
    return Message(syncnorm::BackwardElementwise(ctx_, dtype, g, args));
  }
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

 private:
  static std::string Message(const absl::Status& s) {
    return s.ok() ? "" : s.ToString();
  }
  KernelContext ctx_;
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
