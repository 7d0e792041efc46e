#include "kernels/cpu_grad_sums_loops.h"

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

// dy, x and y (mixed signs, so about half is masked) of n elements.
struct Tensors {
  std::vector<float> dy, x, y;

  Tensors(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> unit(0.0, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      dy.push_back(static_cast<float>(0.2 + unit(rng)));
      x.push_back(static_cast<float>(3.0 + 2 * unit(rng)));
      y.push_back(static_cast<float>(unit(rng)));
    }
  }
};

// Adds element i's d and d * (x - mean) to the references and their
// magnitudes.
struct RefSums {
  long double dy = 0, dy_xmu = 0, mag_dy = 0, mag_dy_xmu = 0;

  void Add(const Tensors& t, bool mask, int64_t i, double mean) {
    const long double d =
        (!mask || t.y[i] > 0) ? static_cast<long double>(t.dy[i]) : 0.0L;
    const long double p = d * (static_cast<long double>(t.x[i]) - mean);
    dy += d;
    dy_xmu += p;
    mag_dy += std::fabs(d);
    mag_dy_xmu += std::fabs(p);
  }
};

// Within a few double ulps of the terms' magnitudes per addition.
void ExpectSumClose(double got, long double ref, long double magnitude,
                    int64_t terms, const std::string& where) {
  EXPECT_LE(std::fabs(got - ref), 4e-16L * magnitude * (terms + 1))
      << where << ": " << got << " vs " << static_cast<double>(ref);
}

TEST(GradSumsLoopsTest, LaneSumsMatchFloat64OnEveryIsa) {
  for (bool mask : {false, true}) {
    for (int64_t len : {0, 1, 7, 8, 9, 16, 17, 63, 1000, 4096, 4099}) {
      for (int64_t offset : {0, 3}) {
        const Tensors t(len + offset, len + 7 * offset);
        const double mean = 2.75;
        RefSums ref;
        for (int64_t i = offset; i < len + offset; ++i) {
          ref.Add(t, mask, i, mean);
        }
        const float* y = mask ? t.y.data() + offset : nullptr;
        double want_dy, want_dy_xmu;
        GradLaneSums(Isa::kGeneric, t.dy.data() + offset, t.x.data() + offset,
                     y, len, mean, want_dy, want_dy_xmu);
        for (Isa isa : kIsas) {
          if (!IsaSupported(isa)) continue;
          const std::string where =
              absl::StrCat("isa ", static_cast<int>(isa), " mask ", mask,
                           " len ", len, " offset ", offset);
          double s_dy = -1, s_dy_xmu = -1;
          GradLaneSums(isa, t.dy.data() + offset, t.x.data() + offset, y, len,
                       mean, s_dy, s_dy_xmu);
          ExpectSumClose(s_dy, ref.dy, ref.mag_dy, len, where + " sum_dy");
          ExpectSumClose(s_dy_xmu, ref.dy_xmu, ref.mag_dy_xmu, len,
                         where + " sum_dy_xmu");
          EXPECT_EQ(0, std::memcmp(&s_dy, &want_dy, sizeof(double))) << where;
          EXPECT_EQ(0, std::memcmp(&s_dy_xmu, &want_dy_xmu, sizeof(double)))
              << where;
        }
      }
    }
  }
}

// Widths around the SIMD column widths, rows padded past the width, and
// sums that already hold values (the walk adds to them).
TEST(GradSumsLoopsTest, RowSumsMatchFloat64OnEveryIsa) {
  for (bool mask : {false, true}) {
    for (int64_t width : {1, 5, 8, 15, 16, 17, 24, 33, 128}) {
      for (int64_t rows : {1, 2, 31, 200}) {
        const int64_t stride = width + (width % 3);
        const Tensors t(rows * stride, width * 31 + rows);
        std::vector<double> mean(width), start_dy(width), start_xmu(width);
        for (int64_t j = 0; j < width; ++j) {
          mean[j] = 2.5 + 0.01 * j;
          start_dy[j] = 0.25 * j - 1;
          start_xmu[j] = 2 - 0.5 * j;
        }
        const float* y = mask ? t.y.data() : nullptr;
        std::vector<double> want_dy = start_dy, want_xmu = start_xmu;
        AddRowGradSums(Isa::kGeneric, t.dy.data(), t.x.data(), y, stride, rows,
                       width, mean.data(), want_dy.data(), want_xmu.data());
        for (Isa isa : kIsas) {
          if (!IsaSupported(isa)) continue;
          std::vector<double> s_dy = start_dy, s_xmu = start_xmu;
          AddRowGradSums(isa, t.dy.data(), t.x.data(), y, stride, rows, width,
                         mean.data(), s_dy.data(), s_xmu.data());
          const std::string where =
              absl::StrCat("isa ", static_cast<int>(isa), " mask ", mask,
                           " width ", width, " rows ", rows);
          for (int64_t j = 0; j < width; ++j) {
            RefSums ref;
            ref.dy = start_dy[j];
            ref.dy_xmu = start_xmu[j];
            ref.mag_dy = std::fabs(start_dy[j]);
            ref.mag_dy_xmu = std::fabs(start_xmu[j]);
            for (int64_t r = 0; r < rows; ++r) {
              ref.Add(t, mask, r * stride + j, mean[j]);
            }
            ExpectSumClose(s_dy[j], ref.dy, ref.mag_dy, rows,
                           absl::StrCat(where, " j ", j, " sum_dy"));
            ExpectSumClose(s_xmu[j], ref.dy_xmu, ref.mag_dy_xmu, rows,
                           absl::StrCat(where, " j ", j, " sum_dy_xmu"));
          }
          EXPECT_EQ(0, std::memcmp(s_dy.data(), want_dy.data(), width * 8))
              << where;
          EXPECT_EQ(0, std::memcmp(s_xmu.data(), want_xmu.data(), width * 8))
              << where;
        }
      }
    }
  }
}

TEST(GradSumsLoopsTest, HalfTypesWidenExactly) {
  const Tensors t(45, 5);
  std::vector<BFloat16> dy, x, y;
  RefSums ref;
  for (int64_t i = 0; i < 45; ++i) {
    dy.push_back(DoubleToBFloat16(t.dy[i]));
    x.push_back(DoubleToBFloat16(t.x[i]));
    y.push_back(DoubleToBFloat16(t.y[i]));
    if (BFloat16ToDouble(y.back()) > 0) {
      const long double d = BFloat16ToDouble(dy.back());
      ref.dy += d;
      ref.dy_xmu += d * (BFloat16ToDouble(x.back()) - 3.0L);
    }
  }
  for (Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    double s_dy, s_dy_xmu;
    GradLaneSums(isa, dy.data(), x.data(), y.data(), 45, 3.0, s_dy, s_dy_xmu);
    EXPECT_NEAR(s_dy, static_cast<double>(ref.dy), 1e-12);
    EXPECT_NEAR(s_dy_xmu, static_cast<double>(ref.dy_xmu), 1e-12);
    std::vector<double> mean(1, 3.0), r_dy(1, 0.0), r_xmu(1, 0.0);
    AddRowGradSums(isa, dy.data(), x.data(), y.data(), 1, 45, 1, mean.data(),
                   r_dy.data(), r_xmu.data());
    EXPECT_NEAR(r_dy[0], static_cast<double>(ref.dy), 1e-12);
    EXPECT_NEAR(r_xmu[0], static_cast<double>(ref.dy_xmu), 1e-12);
  }
}

}  // namespace
}  // namespace cpu
}  // namespace syncnorm
