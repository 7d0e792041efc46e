#include "kernels/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "kernels/half.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm {
namespace check {
namespace {

using LD = reference::Real;
using LongVec = reference::Reals;
using reference::ForEachElement;
using reference::ToReals;

constexpr size_t kMaxFailures = 40;
constexpr int kPerCompare = 3;

// Unit roundoff of an element type.
double Unit(DType d) {
  switch (d) {
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -24);
  }
}

// Smallest positive value of the type's subnormal range (absolute floor of
// rounding error).
double Tiny(DType d) {
  return d == DType::kFloat16 ? std::ldexp(1.0, -24) : 1e-37;
}

// The inputs of one (dtype, layout) case, as exact values of their types.
struct Inputs {
  std::vector<double> x, z, dy, y;
  std::vector<float> weight, bias;
  std::vector<double> mean, invstd, mean_dy, mean_dy_xmu;
};

std::vector<double> RandomTensor(const Layout& l, DType d, uint64_t seed,
                                 double offset, double spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> unit(0.0, 1.0);
  std::vector<double> t(l.size());
  for (int64_t b = 0; b < l.n(); ++b) {
    for (int64_t ch = 0; ch < l.c(); ++ch) {
      for (int64_t s = 0; s < l.spatial(); ++s) {
        double v =
            offset + 0.7 * (ch % 5) - 1.3 + spread * (0.5 + ch % 3) * unit(rng);
        if (v == 0) v = 0.25;
        t[l.At(b, ch, s)] = v;
      }
    }
  }
  return Decode(d, Encode(d, t));  // exactly representable in d
}

template <typename T>
std::vector<T> RandomVector(int64_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// A tensor where the kernels run; freed on scope exit.
class Tensor {
 public:
  Tensor(KernelRunner& r, const std::vector<uint8_t>& bytes)
      : r_(r), bytes_(bytes.size()), p_(r.Upload(bytes)) {}
  ~Tensor() { r_.Free(p_); }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  void* get() const { return p_; }
  std::vector<uint8_t> Read() const { return r_.Download(p_, bytes_); }

 private:
  KernelRunner& r_;
  size_t bytes_;
  void* p_;
};

// One (dtype, layout) case and where its failures go.
class Case {
 public:
  Case(KernelRunner& r, DType d, const Layout& l, const Tolerance& tol,
       std::vector<std::string>* failures, Accuracy* worst)
      : r_(r), d_(d), l_(l), tol_(tol), failures_(failures), worst_(worst) {}

  void Run(uint64_t seed);

 private:
  void Fail(const std::string& what) {
    if (failures_->size() < kMaxFailures) {
      failures_->push_back(std::string(DTypeName(d_)) + " " + l_.Name() + ": " +
                           what);
    }
  }
  bool CheckCall(const std::string& what, const std::string& error) {
    if (error.empty()) return true;
    Fail(what + " failed: " + error);
    return false;
  }
  std::vector<uint8_t> Bytes(const std::vector<double>& v) {
    return Encode(d_, v);
  }
  std::vector<uint8_t> Poison() {
    return Encode(d_, std::vector<double>(l_.size(), std::nan("")));
  }
  void CompareOutput(const std::string& what, const std::vector<uint8_t>& got,
                     const LongVec& ref);

  void CheckMoments(const Inputs& in);
  void CheckForward(const Inputs& in);
  void CheckBackwardReduce(const Inputs& in);
  void CheckBackwardElementwise(const Inputs& in);

  KernelRunner& r_;
  const DType d_;
  const Layout& l_;
  const Tolerance& tol_;
  std::vector<std::string>* failures_;
  Accuracy* worst_;
};

// Raises *worst to v (NaN counts as infinitely bad).
void Worst(double* worst, LD v) {
  const double d = std::isnan(static_cast<double>(v))
                       ? std::numeric_limits<double>::infinity()
                       : static_cast<double>(v);
  *worst = std::max(*worst, d);
}

void Case::CompareOutput(const std::string& what,
                         const std::vector<uint8_t>& got_bytes,
                         const LongVec& ref) {
  const std::vector<double> got = Decode(d_, got_bytes);
  if (got.size() != ref.size()) {
    Fail(what + ": wrong output size");
    return;
  }
  LD max_ref = 0;
  for (LD v : ref) max_ref = std::max(max_ref, std::fabs(v));
  int reported = 0;
  for (size_t i = 0; i < ref.size() && reported < kPerCompare; ++i) {
    const LD rounding = 2 * Unit(d_) * std::fabs(ref[i]) + Tiny(d_);
    const LD tol = rounding + tol_.out * max_ref;
    const LD diff = std::fabs(static_cast<LD>(got[i]) - ref[i]);
    if (max_ref > 0) {
      Worst(&worst_->out, std::max<LD>(0, diff - rounding) / max_ref);
    }
    if (!(diff <= tol)) {  // NaN (an unwritten element) fails too
      std::ostringstream os;
      os << what << "[" << i << "] = " << got[i] << ", reference "
         << static_cast<double>(ref[i]) << ", tolerance "
         << static_cast<double>(tol);
      Fail(os.str());
      ++reported;
    }
  }
}

void Case::CheckMoments(const Inputs& in) {
  // Data whose mean is far larger than its spread, too.
  for (double offset : {0.0, 300.0}) {
    const std::vector<double> x =
        offset == 0 ? in.x : RandomTensor(l_, d_, 99, offset, 1.0);
    const reference::Stats ref = reference::Moments(l_, x);
    const int64_t count = ref.count;
    const LongVec &mean = ref.mean, &m2 = ref.m2;
    Tensor tx(r_, Bytes(x));
    std::vector<double> got_mean(l_.c(), std::nan("")),
        got_m2(l_.c(), std::nan(""));
    const std::string what =
        offset == 0 ? "LocalMoments" : "LocalMoments(offset)";
    if (!CheckCall(what, r_.Moments(d_, tx.get(), l_.geometry(),
                                    got_mean.data(), got_m2.data()))) {
      continue;
    }
    for (int64_t c = 0; c < l_.c(); ++c) {
      const LD std_dev = count > 0 ? std::sqrt(m2[c] / count) : 0;
      const LD ratio = std_dev > 0 ? std::fabs(mean[c]) / std_dev : 0;
      const LD tol_mean = tol_.stats * (std::fabs(mean[c]) + std_dev) + 1e-300L;
      const LD tol_m2 = tol_.stats * m2[c] * (1 + ratio) + 1e-300L;
      const LD err_mean = std::fabs(got_mean[c] - mean[c]);
      const LD err_m2 = std::fabs(got_m2[c] - m2[c]);
      if (std::fabs(mean[c]) + std_dev > 0) {
        Worst(&worst_->stats, err_mean / (std::fabs(mean[c]) + std_dev));
      }
      if (m2[c] > 0) Worst(&worst_->stats, err_m2 / (m2[c] * (1 + ratio)));
      if (!(std::fabs(got_mean[c] - mean[c]) <= tol_mean) ||
          !(std::fabs(got_m2[c] - m2[c]) <= tol_m2)) {
        std::ostringstream os;
        os << what << " channel " << c << ": mean " << got_mean[c] << " m2 "
           << got_m2[c] << ", reference " << static_cast<double>(mean[c]) << " "
           << static_cast<double>(m2[c]);
        Fail(os.str());
        return;
      }
    }
  }
}

void Case::CheckForward(const Inputs& in) {
  struct Options {
    bool z, w, b, relu, in_place;
  };
  const Options options[] = {
      {false, false, false, false, false}, {false, true, true, false, false},
      {true, true, true, false, false},    {true, true, true, true, false},
      {false, false, false, true, false},  {false, true, true, true, true}};
  Tensor tx(r_, Bytes(in.x)), tz(r_, Bytes(in.z));
  for (const Options& o : options) {
    const reference::Normalization n{ToReals(in.mean), ToReals(in.invstd),
                                     o.w ? ToReals(in.weight) : LongVec(),
                                     o.b ? ToReals(in.bias) : LongVec()};
    const LongVec ref =
        reference::Forward(l_, in.x, n, o.z ? &in.z : nullptr, o.relu);
    Tensor ty(r_, o.in_place ? Bytes(in.x) : Poison());
    ForwardArgs a;
    a.x = o.in_place ? ty.get() : tx.get();
    a.y = ty.get();
    a.z = o.z ? tz.get() : nullptr;
    a.weight = o.w ? in.weight.data() : nullptr;
    a.bias = o.b ? in.bias.data() : nullptr;
    a.mean = in.mean.data();
    a.invstd = in.invstd.data();
    a.relu = o.relu;
    std::ostringstream name;
    name << "Forward(z=" << o.z << " affine=" << o.w << " relu=" << o.relu
         << " in_place=" << o.in_place << ")";
    if (CheckCall(name.str(), r_.Forward(d_, l_.geometry(), a))) {
      CompareOutput(name.str(), ty.Read(), ref);
    }
  }
}

void Case::CheckBackwardReduce(const Inputs& in) {
  Tensor tdy(r_, Bytes(in.dy)), tx(r_, Bytes(in.x)), ty(r_, Bytes(in.y));
  for (bool mask : {false, true}) {
    const reference::GradSumsRef ref = reference::BackwardSums(
        l_, in.dy, in.x, mask ? &in.y : nullptr, ToReals(in.mean));
    const LongVec &sum_dy = ref.sum_dy, &sum_dy_xmu = ref.sum_dy_xmu,
                  &mag_dy = ref.abs_dy, &mag_xmu = ref.abs_dy_xmu;
    BackwardReduceArgs a;
    a.dy = tdy.get();
    a.x = tx.get();
    a.y = mask ? ty.get() : nullptr;
    a.mean = in.mean.data();
    a.invstd = in.invstd.data();
    std::vector<double> got_dy(l_.c(), std::nan("")),
        got_xmu(l_.c(), std::nan(""));
    const std::string name =
        std::string("BackwardReduce(mask=") + (mask ? "1" : "0") + ")";
    if (!CheckCall(name, r_.BackwardReduce(d_, l_.geometry(), a, got_dy.data(),
                                           got_xmu.data()))) {
      continue;
    }
    for (int64_t c = 0; c < l_.c(); ++c) {
      if (mag_dy[c] > 0) {
        Worst(&worst_->sums, std::fabs(got_dy[c] - sum_dy[c]) / mag_dy[c]);
      }
      if (mag_xmu[c] > 0) {
        Worst(&worst_->sums,
              std::fabs(got_xmu[c] - sum_dy_xmu[c]) / mag_xmu[c]);
      }
      if (!(std::fabs(got_dy[c] - sum_dy[c]) <= tol_.sums * mag_dy[c]) ||
          !(std::fabs(got_xmu[c] - sum_dy_xmu[c]) <= tol_.sums * mag_xmu[c])) {
        std::ostringstream os;
        os << name << " channel " << c << ": " << got_dy[c] << " " << got_xmu[c]
           << ", reference " << static_cast<double>(sum_dy[c]) << " "
           << static_cast<double>(sum_dy_xmu[c]);
        Fail(os.str());
        break;
      }
    }
  }
}

void Case::CheckBackwardElementwise(const Inputs& in) {
  struct Options {
    bool mask, grad_z, w;
  };
  const Options options[] = {{false, false, false},
                             {false, true, true},
                             {true, false, true},
                             {true, true, true}};
  Tensor tdy(r_, Bytes(in.dy)), tx(r_, Bytes(in.x)), ty(r_, Bytes(in.y));
  for (const Options& o : options) {
    const std::vector<double>* y = o.mask ? &in.y : nullptr;
    const reference::Normalization n{ToReals(in.mean), ToReals(in.invstd),
                                     o.w ? ToReals(in.weight) : LongVec(),
                                     LongVec()};
    const LongVec gi = reference::GradInput(
        l_, in.dy, in.x, y, n, ToReals(in.mean_dy), ToReals(in.mean_dy_xmu));
    LongVec gz(l_.size());
    ForEachElement(l_, [&](int64_t, int64_t i) {
      gz[i] = reference::MaskedDy(in.dy, y, i);
    });
    Tensor tgi(r_, Poison()), tgz(r_, Poison());
    BackwardElementwiseArgs a;
    a.dy = tdy.get();
    a.x = tx.get();
    a.y = o.mask ? ty.get() : nullptr;
    a.mean = in.mean.data();
    a.invstd = in.invstd.data();
    a.weight = o.w ? in.weight.data() : nullptr;
    a.mean_dy = in.mean_dy.data();
    a.mean_dy_xmu = in.mean_dy_xmu.data();
    a.grad_input = tgi.get();
    a.grad_z = o.grad_z ? tgz.get() : nullptr;
    std::ostringstream name;
    name << "BackwardElementwise(mask=" << o.mask << " grad_z=" << o.grad_z
         << " weight=" << o.w << ")";
    if (!CheckCall(name.str(), r_.BackwardElementwise(d_, l_.geometry(), a))) {
      continue;
    }
    CompareOutput(name.str() + " grad_input", tgi.Read(), gi);
    if (o.grad_z) CompareOutput(name.str() + " grad_z", tgz.Read(), gz);
  }
}

void Case::Run(uint64_t seed) {
  Inputs in;
  const int64_t c = l_.c();
  in.x = RandomTensor(l_, d_, seed + 1, 0, 1);
  in.z = RandomTensor(l_, d_, seed + 2, 0, 1);
  in.dy = RandomTensor(l_, d_, seed + 3, 0.2, 0.5);
  in.y = RandomTensor(l_, d_, seed + 4, 0, 1);  // mixed signs: half masked
  in.weight = RandomVector<float>(c, seed + 5, 0.5, 2.0);
  in.bias = RandomVector<float>(c, seed + 6, -1.0, 1.0);
  in.mean = RandomVector<double>(c, seed + 7, -1.5, 1.5);
  in.invstd = RandomVector<double>(c, seed + 8, 0.3, 3.0);
  in.mean_dy = RandomVector<double>(c, seed + 9, -0.2, 0.2);
  in.mean_dy_xmu = RandomVector<double>(c, seed + 10, -0.5, 0.5);
  CheckMoments(in);
  CheckForward(in);
  CheckBackwardReduce(in);
  CheckBackwardElementwise(in);
}

}  // namespace

Tolerance CpuTolerance() { return Tolerance{1e-9, 1e-9, 1e-6}; }

// Reductions accumulate and merge in float64: on the emulator
// (//kernels:cuda_emulated_test, every dtype and shape) the worst errors
// were 5.4e-16 (stats) and 3.3e-16 (sums) of these bounds' units; 1e-12
// leaves room for the GPU's fused multiply-adds. Elementwise arithmetic is
// float32: at most 9.7e-8 of max |ref| beyond rounding to the element type
// (a float32 unit is 6e-8), bounded by 5e-7.
Tolerance GpuTolerance() { return Tolerance{1e-12, 1e-12, 5e-7}; }

std::vector<Layout> StandardLayouts(bool large) {
  std::vector<Layout> v = {
      {{7, 3}, false},         {{5, 4, 9}, false},    {{5, 9, 4}, true},
      {{3, 5, 6, 7}, false},   {{3, 6, 7, 5}, true},  {{2, 3, 4, 5, 6}, false},
      {{2, 4, 5, 6, 3}, true}, {{0, 3, 4}, false},    {{0, 4, 3}, true},
      {{4, 6, 70, 70}, false}, {{64, 40, 37}, true},  {{300, 70}, false},
      {{2, 1100, 3}, false},   {{3, 1, 9, 2}, false},
  };
  if (large) {
    v.push_back({{32, 64, 56, 56}, false});
    v.push_back({{32, 28, 28, 256}, true});
    v.push_back({{4, 32, 16, 32, 32}, false});
    v.push_back({{4, 16, 32, 32, 32}, true});
  }
  return v;
}

std::vector<Layout> OddLayouts() {
  return {
      // 2-D: (N, C), channels-last by nature.
      {{7, 3}, false},
      {{300, 70}, false},
      {{5, 1}, false},
      {{1, 1}, false},
      {{2, 65536}, false},  // C = 65536; rows sliced by planes (of 1)
      // Channels-first: column reads (inner < 32), plane reads (>= 32).
      {{5, 4, 9}, false},
      {{3, 31, 1}, false},
      {{2, 33, 3}, false},
      {{2, 31, 3, 3, 3}, false},  // inner 27
      {{3, 5, 6, 7}, false},
      {{2, 33, 40}, false},     // inner 40: groups of 4 and 8 values
      {{3, 1, 9, 7}, false},    // inner 63: no whole groups
      {{4, 6, 70, 70}, false},  // many strides; rows sliced whole
      {{3, 65536, 2}, false},   // C = 65536, rows sliced by planes
      {{1, 2, 40000}, false},   // planes sliced within
      {{2, 3, 4, 5, 6}, false},
      // Channels-last.
      {{5, 9, 4}, true},
      {{64, 40, 3}, true},  // C = 3: warps read across rows
      {{8, 9, 31}, true},
      {{4, 8, 8, 33}, true},
      {{16, 16, 16, 1}, true},  // C = 1
      {{3, 6, 7, 5}, true},
      {{2, 4, 5, 6, 3}, true},
      {{2, 7, 7, 300}, true},
      // Empty batches.
      {{0, 3, 4}, false},
      {{0, 4, 3}, true},
      {{0, 65536}, false},
  };
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    default:
      return "unknown";
  }
}

size_t ElementSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

std::vector<uint8_t> Encode(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * ElementSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = bytes.data() + i * ElementSize(dtype);
    if (dtype == DType::kFloat32) {
      const float f = static_cast<float>(values[i]);
      std::memcpy(p, &f, 4);
    } else {
      const uint16_t b = dtype == DType::kFloat16
                             ? DoubleToHalf(values[i]).bits
                             : DoubleToBFloat16(values[i]).bits;
      std::memcpy(p, &b, 2);
    }
  }
  return bytes;
}

std::vector<double> Decode(DType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> v(bytes.size() / ElementSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t* p = bytes.data() + i * ElementSize(dtype);
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, p, 4);
      v[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, p, 2);
      v[i] = dtype == DType::kFloat16 ? HalfToDouble(Half{b})
                                      : BFloat16ToDouble(BFloat16{b});
    }
  }
  return v;
}

std::vector<std::string> CheckKernels(KernelRunner& runner,
                                      const std::vector<DType>& dtypes,
                                      const std::vector<Layout>& layouts,
                                      const Tolerance& tol, uint64_t seed,
                                      Accuracy* worst) {
  std::vector<std::string> failures;
  Accuracy ignored;
  for (DType d : dtypes) {
    for (const Layout& l : layouts) {
      Case(runner, d, l, tol, &failures, worst != nullptr ? worst : &ignored)
          .Run(seed);
      seed += 101;
    }
  }
  return failures;
}

}  // namespace check
}  // namespace syncnorm
