// The device check's CPU self-test: the float64 checker (kernel_check.h)
// passes kernels that compute right and reports each kind of wrong result,
// so that its PASS on the GPU means something. No CUDA call.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/batch_norm_types.h"
#include "kernels/kernel_check.h"
#include "tests/gpu/checks.h"

namespace syncnorm::device_check {
namespace {

// Plain float64 loops over host tensors, rounded once to the element type;
// `broken` plants one small error in each kernel.
class HostRunner : public check::KernelRunner {
 public:
  HostRunner(DType dtype, bool broken) : dtype_(dtype), broken_(broken) {}

  std::string Moments(DType, const void* x, const Geometry& g, double* mean,
                      double* m2) override {
    const std::vector<double> v = Values(x);
    const int64_t n = g.per_channel();
    for (int64_t c = 0; c < g.channels; ++c) {
      double sum = 0, sq = 0;
      ForChannel(g, c, [&](int64_t i) { sum += v[i]; });
      mean[c] = n > 0 ? sum / n : 0;
      ForChannel(g, c,
                 [&](int64_t i) { sq += (v[i] - mean[c]) * (v[i] - mean[c]); });
      m2[c] = sq;
      if (broken_) mean[c] += 1e-9 * (std::fabs(mean[c]) + 1);
    }
    return "";
  }
  std::string Forward(DType, const Geometry& g, const ForwardArgs& a) override {
    const std::vector<double> x = Values(a.x);
    std::vector<double> y(x.size()), z = a.z ? Values(a.z) : y;
    for (int64_t c = 0; c < g.channels; ++c) {
      ForChannel(g, c, [&](int64_t i) {
        double v =
            (x[i] - a.mean[c]) * a.invstd[c] * (a.weight ? a.weight[c] : 1.0);
        if (a.bias) v += a.bias[c];
        if (a.z) v += z[i];
        y[i] = a.relu && v < 0 ? 0 : v;
      });
    }
    // Broken: the last element is never written (it keeps its poison).
    Store(a.y, y, broken_ ? y.size() - 1 : y.size());
    return "";
  }
  std::string BackwardReduce(DType, const Geometry& g,
                             const BackwardReduceArgs& a, double* sum_dy,
                             double* sum_dy_xmu) override {
    const std::vector<double> dy = Values(a.dy), x = Values(a.x);
    const std::vector<double> y = a.y ? Values(a.y) : dy;
    for (int64_t c = 0; c < g.channels; ++c) {
      sum_dy[c] = sum_dy_xmu[c] = 0;
      ForChannel(g, c, [&](int64_t i) {
        const double d = !a.y || y[i] > 0 ? dy[i] : 0;
        sum_dy[c] += d;
        sum_dy_xmu[c] += d * (x[i] - a.mean[c]);
      });
      if (broken_) sum_dy_xmu[c] *= 1 + 1e-10;
    }
    return "";
  }
  std::string BackwardElementwise(DType, const Geometry& g,
                                  const BackwardElementwiseArgs& a) override {
    const std::vector<double> dy = Values(a.dy), x = Values(a.x);
    const std::vector<double> y = a.y ? Values(a.y) : dy;
    std::vector<double> gi(dy.size()), gz(dy.size());
    for (int64_t c = 0; c < g.channels; ++c) {
      const double invstd = a.invstd[c];
      const double w = a.weight ? a.weight[c] : 1.0;
      ForChannel(g, c, [&](int64_t i) {
        const double d = !a.y || y[i] > 0 ? dy[i] : 0;
        gi[i] = w * invstd *
                (d - a.mean_dy[c] -
                 (x[i] - a.mean[c]) * invstd * invstd * a.mean_dy_xmu[c]);
        gz[i] = d;
      });
    }
    Store(a.grad_input, gi, gi.size());
    // Broken: grad_z is left as it was.
    if (a.grad_z != nullptr && !broken_) Store(a.grad_z, gz, gz.size());
    return "";
  }

  void* Upload(const std::vector<uint8_t>& bytes) override {
    if (bytes.empty()) return nullptr;
    auto copy = std::make_unique<std::vector<uint8_t>>(bytes);
    void* p = copy->data();
    tensors_[p] = std::move(copy);
    return p;
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) override {
    if (bytes == 0) return {};
    const auto& t = *tensors_.at(const_cast<void*>(p));
    return std::vector<uint8_t>(t.begin(), t.begin() + bytes);
  }
  void Free(void* p) override { tensors_.erase(p); }

 private:
  template <typename Fn>
  static void ForChannel(const Geometry& g, int64_t c, Fn&& fn) {
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t j = 0; j < g.inner; ++j)
        fn((o * g.channels + c) * g.inner + j);
    }
  }
  std::vector<double> Values(const void* p) {
    if (p == nullptr) return {};
    return check::Decode(dtype_, *tensors_.at(const_cast<void*>(p)));
  }
  void Store(void* p, const std::vector<double>& v, size_t n) {
    if (p == nullptr) return;
    const std::vector<uint8_t> bytes = check::Encode(dtype_, v);
    std::memcpy(p, bytes.data(), n * check::ElementSize(dtype_));
  }

  const DType dtype_;
  const bool broken_;
  std::map<void*, std::unique_ptr<std::vector<uint8_t>>> tensors_;
};

bool Mentions(const std::vector<std::string>& failures, const char* what) {
  for (const std::string& f : failures) {
    if (f.find(what) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

int RunSelfTest() {
  int failed = 0;
  const std::vector<check::Layout> layouts = {{{5, 4, 9}, false},
                                              {{3, 6, 7, 5}, true},
                                              {{0, 3, 4}, false},
                                              {{7, 3}, false}};
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    HostRunner right(d, false);
    const std::vector<std::string> none = check::CheckKernels(
        right, {d}, layouts, check::GpuTolerance(), /*seed=*/5);
    failed += Report(none.empty(),
                     std::string("self-test: right ") + check::DTypeName(d) +
                         " results pass",
                     none.empty() ? "" : none[0]);
    HostRunner broken(d, true);
    const std::vector<std::string> caught = check::CheckKernels(
        broken, {d}, layouts, check::GpuTolerance(), /*seed=*/5);
    for (const char* kernel :
         {"LocalMoments", "Forward(", "BackwardReduce(", "grad_z"}) {
      failed +=
          Report(Mentions(caught, kernel),
                 std::string("self-test: a wrong ") + check::DTypeName(d) +
                     " result of " + kernel + " is reported",
                 std::to_string(caught.size()) + " failure line(s)");
    }
  }
  return failed;
}

}  // namespace syncnorm::device_check
