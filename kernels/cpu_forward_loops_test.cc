#include "kernels/cpu_forward_loops.h"

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
// Elements around the output that no loop may write.
constexpr int64_t kGuard = 16;

const Isa kIsas[] = {Isa::kGeneric, Isa::kSse2, Isa::kAvx2};

std::string Name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kSse2:
      return "sse2";
    default:
      return "avx2";
  }
}

std::string Name(const ForwardLoopOptions& o) {
  return absl::StrCat("last=", o.last, " residual=", o.residual,
                      " relu=", o.relu, " stream=", o.stream);
}

// Every combination of the four options.
std::vector<ForwardLoopOptions> AllOptions() {
  std::vector<ForwardLoopOptions> all;
  for (int m = 0; m < 16; ++m) {
    ForwardLoopOptions o;
    o.last = m & 1;
    o.residual = m & 2;
    o.relu = m & 4;
    o.stream = m & 8;
    all.push_back(o);
  }
  return all;
}

// Inputs of one call: rows x len elements and coefficients for either
// indexing, never zero; a few x are NaN.
struct Case {
  int64_t rows, len;
  std::vector<float> x, z;
  std::vector<double> mean, scale, shift;

  Case(int64_t rows_in, int64_t len_in, uint64_t seed)
      : rows(rows_in), len(len_in) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> unit(0.0, 1.0);
    const int64_t n = rows * len, k = std::max(rows, len);
    for (int64_t i = 0; i < n; ++i) {
      x.push_back(static_cast<float>(1.5 + 2 * unit(rng)));
      z.push_back(static_cast<float>(0.5 * unit(rng)));
    }
    if (n > 5) x[n / 3] = kNaNf;
    for (int64_t i = 0; i < k; ++i) {
      mean.push_back(1.5 + 0.1 * unit(rng));
      scale.push_back(0.3 + std::fabs(unit(rng)));
      shift.push_back(0.25 * unit(rng) + 0.01);
    }
  }
};

// The float64 reference of element i and a bound on the double arithmetic's
// error (terms' magnitudes times a few double ulps).
long double Reference(const Case& c, const ForwardLoopOptions& o, int64_t i,
                      long double& slack) {
  const int64_t k = o.last ? i % c.len : i / c.len;
  const long double t = (static_cast<long double>(c.x[i]) - c.mean[k]) *
                        static_cast<long double>(c.scale[k]);
  long double v = t + c.shift[k];
  slack = 1e-15L * (std::fabs(t) + std::fabs(c.shift[k]) +
                    (o.residual ? std::fabs(c.z[i]) : 0.0L));
  if (o.residual) v += c.z[i];
  if (o.relu && v < 0) v = 0;
  return v;
}

// Runs the loop on a poisoned buffer whose output starts `offset` floats
// past a 64-byte boundary; returns the rows * len outputs and checks that
// the guard elements around them stay unwritten.
std::vector<float> RunLoop(Isa isa, const ForwardLoopOptions& o, const Case& c,
                           int64_t offset) {
  const int64_t n = c.rows * c.len;
  std::vector<float> buffer(n + 2 * kGuard + 32, kNaNf);
  const uintptr_t a = reinterpret_cast<uintptr_t>(buffer.data() + kGuard);
  float* y =
      buffer.data() + kGuard + (64 - a % 64) % 64 / sizeof(float) + offset;
  PickForwardRows<float>(isa, o)(c.x.data(), c.z.data(), y, c.rows, c.len,
                                 c.mean.data(), c.scale.data(), c.shift.data());
  StoreFence();
  for (float* p = buffer.data(); p < y; ++p) EXPECT_TRUE(std::isnan(*p));
  for (float* p = y + n; p < buffer.data() + buffer.size(); ++p) {
    EXPECT_TRUE(std::isnan(*p));
  }
  return std::vector<float>(y, y + n);
}

TEST(ForwardLoopsTest, EveryIsaAndOptionMatchesFloat64) {
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    for (const ForwardLoopOptions& o : AllOptions()) {
      for (int64_t len : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 40, 129}) {
        for (int64_t rows : {1, 3}) {
          const Case c(rows, len, 100 * len + rows);
          const std::vector<float> y = RunLoop(isa, o, c, len % 8);
          for (int64_t i = 0; i < rows * len; ++i) {
            long double slack;
            const long double ref = Reference(c, o, i, slack);
            const std::string where =
                absl::StrCat(Name(isa), " ", Name(o), " rows=", rows,
                             " len=", len, " i=", i);
            if (std::isnan(ref)) {
              EXPECT_TRUE(std::isnan(y[i])) << where;
              continue;
            }
            EXPECT_LE(std::fabs(y[i] - ref),
                      std::ldexp(std::fabs(ref), -24) + slack)
                << where << ": " << y[i] << " vs " << static_cast<double>(ref);
          }
        }
      }
    }
  }
}

// The SIMD loops and streaming stores change speed, never bits: for every
// alignment of y, each Isa with and without streaming equals the generic
// loop with ordinary stores.
TEST(ForwardLoopsTest, EveryIsaAndStoreKindGivesTheSameBits) {
  const Case c(5, 203, 7);
  for (const ForwardLoopOptions& base : AllOptions()) {
    if (base.stream) continue;
    const std::vector<float> want = RunLoop(Isa::kGeneric, base, c, 0);
    for (Isa isa : kIsas) {
      if (!IsaSupported(isa)) continue;
      for (bool stream : {false, true}) {
        ForwardLoopOptions o = base;
        o.stream = stream;
        for (int64_t offset = 0; offset < 8; ++offset) {
          const std::vector<float> got = RunLoop(isa, o, c, offset);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(),
                                   want.size() * sizeof(float)))
              << Name(isa) << " " << Name(o) << " offset " << offset;
        }
      }
    }
  }
}

TEST(ForwardLoopsTest, InPlaceEqualsOutOfPlace) {
  const Case c(3, 77, 9);
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    for (const ForwardLoopOptions& o : AllOptions()) {
      const std::vector<float> want = RunLoop(isa, o, c, 0);
      std::vector<float> y = c.x;
      PickForwardRows<float>(isa, o)(y.data(), c.z.data(), y.data(), c.rows,
                                     c.len, c.mean.data(), c.scale.data(),
                                     c.shift.data());
      StoreFence();
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
          << Name(isa) << " " << Name(o);
    }
  }
}

// Half and BFloat16 take the generic loop whatever the Isa; it rounds the
// double result once to the type.
TEST(ForwardLoopsTest, HalfTypesRoundTheDoubleResultOnce) {
  const Case c(2, 19, 11);
  std::vector<Half> xh, zh, yh(c.x.size());
  std::vector<BFloat16> xb, zb, yb(c.x.size());
  for (size_t i = 0; i < c.x.size(); ++i) {
    xh.push_back(DoubleToHalf(c.x[i]));
    zh.push_back(DoubleToHalf(c.z[i]));
    xb.push_back(DoubleToBFloat16(c.x[i]));
    zb.push_back(DoubleToBFloat16(c.z[i]));
  }
  ForwardLoopOptions o;
  o.residual = true;
  o.relu = true;
  o.stream = true;
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    PickForwardRows<Half>(isa, o)(xh.data(), zh.data(), yh.data(), c.rows,
                                  c.len, c.mean.data(), c.scale.data(),
                                  c.shift.data());
    PickForwardRows<BFloat16>(isa, o)(xb.data(), zb.data(), yb.data(), c.rows,
                                      c.len, c.mean.data(), c.scale.data(),
                                      c.shift.data());
    for (int64_t i = 0; i < c.rows * c.len; ++i) {
      const int64_t r = i / c.len;
      auto want = [&](double x, double z) {
        const double v = (x - c.mean[r]) * c.scale[r] + c.shift[r] + z;
        return v < 0 ? 0.0 : v;
      };
      const double vh = want(HalfToDouble(xh[i]), HalfToDouble(zh[i]));
      const double vb = want(BFloat16ToDouble(xb[i]), BFloat16ToDouble(zb[i]));
      EXPECT_EQ(yh[i].bits, DoubleToHalf(vh).bits) << Name(isa) << " " << i;
      EXPECT_EQ(yb[i].bits, DoubleToBFloat16(vb).bits) << Name(isa) << " " << i;
    }
  }
}

TEST(ForwardLoopsTest, StreamingThresholdIsAtLeastACache) {
  EXPECT_GE(StreamingStoreBytes(), int64_t{1} << 20);
}

}  // namespace
}  // namespace cpu
}  // namespace syncnorm
