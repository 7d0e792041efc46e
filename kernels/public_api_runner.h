// A check::KernelRunner over the public API (batch_norm.h): the kernel
// checks' common half of the CPU and the CUDA runners. Subclasses say where
// tensors live (Upload, Download, Free) and set the context's device.
#ifndef SYNCNORM_KERNELS_PUBLIC_API_RUNNER_H_
#define SYNCNORM_KERNELS_PUBLIC_API_RUNNER_H_

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "kernels/batch_norm.h"
#include "kernels/kernel_check.h"
#include "kernels/moments.h"

namespace syncnorm::check {

class PublicApiRunner : public KernelRunner {
 public:
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

 protected:
  KernelContext ctx_;

 private:
  static std::string Message(const absl::Status& s) {
    return s.ok() ? "" : s.ToString();
  }
};

}  // namespace syncnorm::check

#endif  // SYNCNORM_KERNELS_PUBLIC_API_RUNNER_H_
