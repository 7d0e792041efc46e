#include "kernels/cpu_backward_loops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_isa.h"
#include "kernels/half.h"

namespace syncnorm {
namespace cpu {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

const Isa kIsas[] = {Isa::kGeneric, Isa::kSse2, Isa::kAvx2};

std::string Name(Isa isa, const BackwardLoopOptions& o) {
  return absl::StrCat("isa ", static_cast<int>(isa), " last=", o.last,
                      " mask=", o.mask, " grad_z=", o.grad_z);
}

std::vector<BackwardLoopOptions> AllOptions() {
  std::vector<BackwardLoopOptions> all;
  for (int m = 0; m < 8; ++m) {
    BackwardLoopOptions o;
    o.last = m & 1;
    o.mask = m & 2;
    o.grad_z = m & 4;
    all.push_back(o);
  }
  return all;
}

// Inputs of one call: rows x len elements (y of mixed signs, a NaN in y and
// one in dy) and coefficients for either indexing.
struct Case {
  int64_t rows, len;
  std::vector<float> dy, x, y;
  std::vector<double> mean, a, mean_dy, k;

  Case(int64_t rows_in, int64_t len_in, uint64_t seed)
      : rows(rows_in), len(len_in) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> unit(0.0, 1.0);
    const int64_t n = rows * len, m = std::max(rows, len);
    for (int64_t i = 0; i < n; ++i) {
      dy.push_back(static_cast<float>(0.3 + unit(rng)));
      x.push_back(static_cast<float>(1.5 + 2 * unit(rng)));
      y.push_back(static_cast<float>(unit(rng)));
    }
    if (n > 5) {
      y[n / 3] = kNaNf;
      dy[n / 2] = kNaNf;
    }
    for (int64_t i = 0; i < m; ++i) {
      mean.push_back(1.5 + 0.1 * unit(rng));
      a.push_back(0.5 + std::fabs(unit(rng)));
      mean_dy.push_back(0.1 * unit(rng));
      k.push_back(0.2 * unit(rng));
    }
  }
  BackwardCoefficients co() const {
    return {mean.data(), a.data(), mean_dy.data(), k.data()};
  }
};

struct Outputs {
  std::vector<float> grad_input, grad_z;
};

Outputs RunLoop(Isa isa, const BackwardLoopOptions& o, const Case& c) {
  Outputs out{std::vector<float>(c.dy.size(), kNaNf),
              std::vector<float>(c.dy.size(), kNaNf)};
  PickBackwardRows<float>(isa, o)(
      c.dy.data(), c.x.data(), o.mask ? c.y.data() : nullptr,
      out.grad_input.data(), o.grad_z ? out.grad_z.data() : nullptr, c.rows,
      c.len, c.co());
  return out;
}

TEST(BackwardLoopsTest, EveryIsaAndOptionMatchesFloat64) {
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    for (const BackwardLoopOptions& o : AllOptions()) {
      for (int64_t len : {1, 3, 4, 5, 8, 9, 16, 17, 40, 129}) {
        for (int64_t rows : {1, 3}) {
          const Case c(rows, len, 10 * len + rows);
          const Outputs out = RunLoop(isa, o, c);
          for (int64_t i = 0; i < rows * len; ++i) {
            const int64_t m = o.last ? i % len : i / len;
            const long double d = (!o.mask || c.y[i] > 0)
                                      ? static_cast<long double>(c.dy[i])
                                      : 0.0L;
            const long double t =
                (static_cast<long double>(c.x[i]) - c.mean[m]) * c.k[m];
            const long double ref = c.a[m] * (d - c.mean_dy[m] - t);
            const long double slack =
                1e-15L * c.a[m] *
                (std::fabs(d) + std::fabs(c.mean_dy[m]) + std::fabs(t));
            const std::string where = absl::StrCat(Name(isa, o), " rows=", rows,
                                                   " len=", len, " i=", i);
            if (std::isnan(ref)) {
              EXPECT_TRUE(std::isnan(out.grad_input[i])) << where;
            } else {
              EXPECT_LE(std::fabs(out.grad_input[i] - ref),
                        std::ldexp(std::fabs(ref), -24) + slack)
                  << where << ": " << out.grad_input[i] << " vs "
                  << static_cast<double>(ref);
            }
            if (o.grad_z) {
              const float want = static_cast<float>(d);
              EXPECT_EQ(0, std::memcmp(&out.grad_z[i], &want, sizeof(want)))
                  << where << ": grad_z " << out.grad_z[i];
            } else {
              EXPECT_TRUE(std::isnan(out.grad_z[i])) << where;
            }
          }
        }
      }
    }
  }
}

TEST(BackwardLoopsTest, EveryIsaGivesTheSameBits) {
  const Case c(4, 203, 3);
  for (const BackwardLoopOptions& o : AllOptions()) {
    const Outputs want = RunLoop(Isa::kGeneric, o, c);
    for (Isa isa : kIsas) {
      if (!IsaSupported(isa)) continue;
      const Outputs got = RunLoop(isa, o, c);
      const size_t bytes = want.grad_input.size() * sizeof(float);
      EXPECT_EQ(
          0, std::memcmp(got.grad_input.data(), want.grad_input.data(), bytes))
          << Name(isa, o);
      EXPECT_EQ(0, std::memcmp(got.grad_z.data(), want.grad_z.data(), bytes))
          << Name(isa, o);
    }
  }
}

TEST(BackwardLoopsTest, GradientsMayOverwriteDy) {
  const Case c(3, 77, 5);
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    for (const BackwardLoopOptions& o : AllOptions()) {
      const Outputs want = RunLoop(isa, o, c);
      std::vector<float> inplace = c.dy;
      std::vector<float> grad_z(c.dy.size(), kNaNf);
      PickBackwardRows<float>(isa, o)(
          inplace.data(), c.x.data(), o.mask ? c.y.data() : nullptr,
          inplace.data(), o.grad_z ? grad_z.data() : nullptr, c.rows, c.len,
          c.co());
      EXPECT_EQ(0, std::memcmp(inplace.data(), want.grad_input.data(),
                               inplace.size() * sizeof(float)))
          << Name(isa, o);
    }
  }
}

// Half and BFloat16 take the generic loop whatever the Isa.
TEST(BackwardLoopsTest, HalfTypesRoundTheDoubleResultOnce) {
  const Case c(2, 19, 11);
  std::vector<Half> dy, x, y, gi(c.dy.size()), gz(c.dy.size());
  for (size_t i = 0; i < c.dy.size(); ++i) {
    dy.push_back(DoubleToHalf(c.dy[i]));
    x.push_back(DoubleToHalf(c.x[i]));
    y.push_back(DoubleToHalf(c.y[i]));
  }
  BackwardLoopOptions o;
  o.mask = true;
  o.grad_z = true;
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    PickBackwardRows<Half>(isa, o)(dy.data(), x.data(), y.data(), gi.data(),
                                   gz.data(), c.rows, c.len, c.co());
    for (int64_t i = 0; i < c.rows * c.len; ++i) {
      const int64_t r = i / c.len;
      const double d = HalfToDouble(y[i]) > 0 ? HalfToDouble(dy[i]) : 0.0;
      const double g = c.a[r] * (d - c.mean_dy[r] -
                                 (HalfToDouble(x[i]) - c.mean[r]) * c.k[r]);
      EXPECT_EQ(gi[i].bits, DoubleToHalf(g).bits) << i;
      EXPECT_EQ(gz[i].bits, DoubleToHalf(d).bits) << i;
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace syncnorm
