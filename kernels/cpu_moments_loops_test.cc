#include "kernels/cpu_moments_loops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
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

const Isa kIsas[] = {Isa::kGeneric, Isa::kSse2, Isa::kAvx2};

// Values around `mean` with unit spread, never exactly the shift.
std::vector<float> Values(int64_t n, double mean, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> unit(0.0, 1.0);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + unit(rng));
  return v;
}

// |got - ref| within a few double ulps of the sum of the terms' magnitudes
// per addition: far tighter than float rounding, far looser than the
// double rounding any correct order gives.
void ExpectSumClose(double got, long double ref, long double magnitude,
                    int64_t terms, const std::string& where) {
  const long double tol = 4e-16L * magnitude * (terms + 1);
  EXPECT_LE(std::fabs(got - ref), tol)
      << where << ": " << got << " vs " << static_cast<double>(ref);
}

TEST(MomentsLoopsTest, ShiftedSumsMatchFloat64OnEveryIsa) {
  for (double mean : {0.0, 1e4}) {
    for (int64_t len : {0, 1, 7, 8, 9, 15, 16, 17, 63, 1000, 4096, 4099}) {
      for (int64_t offset : {0, 1, 3}) {
        const std::vector<float> v = Values(len + offset, mean, len + offset);
        const float* p = v.data() + offset;
        const double shift = len > 0 ? p[0] : 0.0;
        long double r1 = 0, r2 = 0, m1 = 0, m2 = 0;
        for (int64_t i = 0; i < len; ++i) {
          const long double d = static_cast<long double>(p[i]) - shift;
          r1 += d;
          r2 += d * d;
          m1 += std::fabs(d);
          m2 += d * d;
        }
        double want1 = 0, want2 = 0;
        ShiftedSums(Isa::kGeneric, p, len, shift, want1, want2);
        for (Isa isa : kIsas) {
          if (!IsaSupported(isa)) continue;
          const std::string where =
              absl::StrCat("isa ", static_cast<int>(isa), " mean ", mean,
                           " len ", len, " offset ", offset);
          double s1 = -1, s2 = -1;
          ShiftedSums(isa, p, len, shift, s1, s2);
          ExpectSumClose(s1, r1, m1, len, where + " s1");
          ExpectSumClose(s2, r2, m2, len, where + " s2");
          // The lanes and their order are the same on every Isa.
          EXPECT_EQ(0, std::memcmp(&s1, &want1, sizeof(s1))) << where;
          EXPECT_EQ(0, std::memcmp(&s2, &want2, sizeof(s2))) << where;
        }
      }
    }
  }
}

// Widths around the 8- and 16-channel columns of the SIMD walks, rows that
// span several chunks of it, rows padded past the width, and sums that
// already hold values (the walk adds to them).
TEST(MomentsLoopsTest, RowShiftedSumsMatchFloat64OnEveryIsa) {
  for (double mean : {0.0, -1e4}) {
    for (int64_t width : {1, 5, 8, 15, 16, 17, 24, 33, 128, 256}) {
      for (int64_t rows : {1, 2, 31, 600}) {
        const int64_t stride = width + (width % 3);
        const std::vector<float> x = Values(rows * stride, mean, width + rows);
        std::vector<double> shift(width), start1(width), start2(width);
        for (int64_t j = 0; j < width; ++j) {
          shift[j] = x[j] + 0.5;
          start1[j] = 0.25 * j - 1;
          start2[j] = 0.5 * j + 2;
        }
        std::vector<double> want1 = start1, want2 = start2;
        AddRowShiftedSums(Isa::kGeneric, x.data(), stride, rows, width,
                          shift.data(), want1.data(), want2.data());
        for (Isa isa : kIsas) {
          if (!IsaSupported(isa)) continue;
          std::vector<double> s1 = start1, s2 = start2;
          AddRowShiftedSums(isa, x.data(), stride, rows, width, shift.data(),
                            s1.data(), s2.data());
          for (int64_t j = 0; j < width; ++j) {
            long double r1 = start1[j], r2 = start2[j];
            long double m1 = std::fabs(r1), m2 = r2;
            for (int64_t r = 0; r < rows; ++r) {
              const long double d =
                  static_cast<long double>(x[r * stride + j]) - shift[j];
              r1 += d;
              r2 += d * d;
              m1 += std::fabs(d);
              m2 += d * d;
            }
            const std::string where =
                absl::StrCat("isa ", static_cast<int>(isa), " mean ", mean,
                             " width ", width, " rows ", rows, " j ", j);
            ExpectSumClose(s1[j], r1, m1, rows, where + " s1");
            ExpectSumClose(s2[j], r2, m2, rows, where + " s2");
          }
          // Each channel adds its rows in order on every Isa.
          EXPECT_EQ(0, std::memcmp(s1.data(), want1.data(), width * 8))
              << "isa " << static_cast<int>(isa) << " width " << width
              << " rows " << rows;
          EXPECT_EQ(0, std::memcmp(s2.data(), want2.data(), width * 8))
              << "isa " << static_cast<int>(isa) << " width " << width
              << " rows " << rows;
        }
      }
    }
  }
}

TEST(MomentsLoopsTest, HalfTypesWidenExactly) {
  const std::vector<float> v = Values(37, 2.0, 5);
  std::vector<Half> h;
  std::vector<BFloat16> b;
  long double rh = 0, rb = 0;
  for (float f : v) {
    h.push_back(DoubleToHalf(f));
    b.push_back(DoubleToBFloat16(f));
    rh += HalfToDouble(h.back()) - 2.0L;
    rb += BFloat16ToDouble(b.back()) - 2.0L;
  }
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    double s1, s2;
    ShiftedSums(isa, h.data(), 37, 2.0, s1, s2);
    EXPECT_NEAR(s1, static_cast<double>(rh), 1e-12);
    ShiftedSums(isa, b.data(), 37, 2.0, s1, s2);
    EXPECT_NEAR(s1, static_cast<double>(rb), 1e-12);
    std::vector<double> shift(1, 2.0), t1(1, 0.0), t2(1, 0.0);
    AddRowShiftedSums(isa, h.data(), 1, 37, 1, shift.data(), t1.data(),
                      t2.data());
    EXPECT_NEAR(t1[0], static_cast<double>(rh), 1e-12);
  }
}

}  // namespace
}  // namespace cpu
}  // namespace syncnorm
