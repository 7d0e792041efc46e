// A self-checking sweep of the batch-norm kernels against the float64
// reference (kernels/testing/batch_norm_reference.h), for every dtype, both
// layouts and ranks 2 to 5, on fresh random data, with every output
// poisoned (NaN) before the call.
//
// Free of Abseil, gtest and CUDA types: the CPU tests, the Bazel GPU test and
// the standalone device check (tests/gpu/device_check.sh, built by nvcc
// alone) all run it through their own KernelRunner. Test-only.
#ifndef SYNCNORM_KERNELS_KERNEL_CHECK_H_
#define SYNCNORM_KERNELS_KERNEL_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm_types.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm {
namespace check {

// Calls the kernels and moves bytes to and from where they run. Kernel
// methods return "" on success, else the error message.
class KernelRunner {
 public:
  virtual ~KernelRunner() = default;

  virtual std::string Moments(DType dtype, const void* x, const Geometry& g,
                              double* mean, double* m2) = 0;
  virtual std::string Forward(DType dtype, const Geometry& g,
                              const ForwardArgs& args) = 0;
  virtual std::string BackwardReduce(DType dtype, const Geometry& g,
                                     const BackwardReduceArgs& args,
                                     double* sum_dy, double* sum_dy_xmu) = 0;
  virtual std::string BackwardElementwise(
      DType dtype, const Geometry& g, const BackwardElementwiseArgs& args) = 0;

  // Memory where the kernels read tensors; nullptr for 0 bytes.
  virtual void* Upload(const std::vector<uint8_t>& bytes) = 0;
  virtual std::vector<uint8_t> Download(const void* p, size_t bytes) = 0;
  virtual void Free(void* p) = 0;
};

// How far results may be from the reference, as fractions.
struct Tolerance {
  // mean and m2: of max(|ref|, spread of the channel).
  double stats = 1e-9;
  // Gradient sums: of the sum of the terms' magnitudes.
  double sums = 1e-9;
  // Elementwise outputs: of max |ref| of the tensor, on top of rounding to
  // the element type (2 units in the last place of the output type).
  double out = 1e-6;
};

// The largest errors seen, in the units of Tolerance's fields (so a check
// passes when each is at most its tolerance); `out` counts only the error
// beyond rounding to the element type.
struct Accuracy {
  double stats = 0;
  double sums = 0;
  double out = 0;
};

// For the CPU kernels (float64 throughout) and the CUDA kernels (float64
// reductions, float32 elementwise arithmetic); see kernel_check.cc for how
// each was measured.
Tolerance CpuTolerance();
Tolerance GpuTolerance();

// A tensor's shape and layout: the float64 reference's.
using Layout = reference::Layout;

// Ranks 2 to 5 in both layouts, an empty batch, and shapes big enough to
// span many GPU blocks. `large` adds shapes of a few million elements.
std::vector<Layout> StandardLayouts(bool large);

// Shapes that find the edges of the CUDA kernels: C = 1, 3, 31, 33 and
// 65536, inner sizes from 1 to 40000 (each side of the 32 where reading
// switches from columns to planes, with and without whole 16-byte groups),
// rows sliced whole, by planes and within a plane when launches are
// bounded to 32768 elements (as the emulated build is), tensors many grid
// strides long, ranks 2 to 5 in both layouts, and empty batches. A few
// hundred thousand elements at most.
std::vector<Layout> OddLayouts();

const char* DTypeName(DType dtype);

// Element bytes of dtype and conversions of whole tensors.
size_t ElementSize(DType dtype);
std::vector<uint8_t> Encode(DType dtype, const std::vector<double>& values);
std::vector<double> Decode(DType dtype, const std::vector<uint8_t>& bytes);

// Runs every kernel with every option on every layout and dtype given;
// returns one line per failure (empty: all passed). `seed` varies the data.
// `worst`, if given, gets the largest errors seen (over its prior values).
std::vector<std::string> CheckKernels(KernelRunner& runner,
                                      const std::vector<DType>& dtypes,
                                      const std::vector<Layout>& layouts,
                                      const Tolerance& tol, uint64_t seed,
                                      Accuracy* worst = nullptr);

}  // namespace check
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_KERNEL_CHECK_H_
