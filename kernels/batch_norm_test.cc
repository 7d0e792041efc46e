#include "kernels/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "kernels/thread_pool.h"

namespace syncnorm {
namespace {

using reference::ExpectClose;
using reference::ForEachElement;
using reference::Layout;
using reference::MaxAbs;
using reference::ToReals;
using LongVec = reference::Reals;

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kOutputTol = 1e-6;  // fp32 outputs, relative to max |ref|
constexpr double kStatsTol = 1e-9;   // float64 statistics, relative

// The kernels' view of a layout, by the kernels' own MakeGeometry.
Geometry GeometryOf(const Layout& l) {
  absl::StatusOr<Geometry> g = MakeGeometry(l.shape, l.channels_last);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : Geometry{};
}

// Random data, never zero: channel ch has its own offset and spread.
std::vector<float> RandomTensor(const Layout& l, uint64_t seed,
                                double offset = 0, double spread = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> unit(0.0, 1.0);
  std::vector<float> t(l.size());
  ForEachElement(l, [&](int64_t ch, int64_t i) {
    double v =
        offset + 0.7 * (ch % 5) - 1.3 + spread * (0.5 + ch % 3) * unit(rng);
    if (v == 0) v = 0.25;
    t[i] = static_cast<float>(v);
  });
  return t;
}

template <typename T>
std::vector<T> RandomVector(int64_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// ---- inputs and the float64 reference ---------------------------------------

struct ForwardInputs {
  std::vector<float> x, z, weight, bias;
  std::vector<double> mean, invstd;
};

LongVec ReferenceForward(const Layout& l, const ForwardInputs& in, bool use_z,
                         bool use_w, bool use_b, bool relu) {
  const reference::Normalization n{ToReals(in.mean), ToReals(in.invstd),
                                   use_w ? ToReals(in.weight) : LongVec(),
                                   use_b ? ToReals(in.bias) : LongVec()};
  return reference::Forward(l, in.x, n, use_z ? &in.z : nullptr, relu);
}

struct BackwardInputs {
  std::vector<float> dy, x, y, weight;
  std::vector<double> mean, invstd, mean_dy, mean_dy_xmu;
};

// y, the ReLU's output, when `mask`.
const std::vector<float>* MaskOf(const BackwardInputs& in, bool mask) {
  return mask ? &in.y : nullptr;
}

LongVec ReferenceGradInput(const Layout& l, const BackwardInputs& in, bool mask,
                           bool use_w) {
  const reference::Normalization n{ToReals(in.mean), ToReals(in.invstd),
                                   use_w ? ToReals(in.weight) : LongVec(),
                                   LongVec()};
  return reference::GradInput(l, in.dy, in.x, MaskOf(in, mask), n,
                              ToReals(in.mean_dy), ToReals(in.mean_dy_xmu));
}

// ---- comparisons -----------------------------------------------------------

// Per-channel statistics: relative to each value (floored at 1e-3 of the
// largest, for values that cancel to near zero).
void ExpectStatsClose(const std::vector<double>& got, const LongVec& ref,
                      const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const long double floor = 1e-3L * MaxAbs(ref);
  for (size_t c = 0; c < ref.size(); ++c) {
    const long double tol =
        kStatsTol * std::max({std::fabs(ref[c]), floor, 1e-300L});
    EXPECT_LE(std::fabs(got[c] - ref[c]), tol)
        << what << "[" << c << "] = " << got[c] << ", reference "
        << static_cast<double>(ref[c]);
  }
}

Moments PoisonedMoments() {
  Moments m;
  m.count = -1;
  m.mean.assign(3, kNaN);
  m.m2.assign(3, kNaN);
  return m;
}

GradSums PoisonedSums() {
  GradSums s;
  s.sum_dy.assign(2, kNaN);
  s.sum_dy_xmu.assign(2, kNaN);
  return s;
}

// ---- per-shape tests -------------------------------------------------------

class KernelTest : public testing::TestWithParam<Layout> {
 protected:
  KernelContext Context(int threads) {
    pool_ = threads > 0 ? std::make_unique<ThreadPool>(threads) : nullptr;
    KernelContext ctx;
    ctx.pool = pool_.get();
    return ctx;
  }

  ForwardInputs MakeForwardInputs(const Layout& l) {
    ForwardInputs in;
    in.x = RandomTensor(l, 1);
    in.z = RandomTensor(l, 2);
    in.weight = RandomVector<float>(l.c(), 3, 0.5, 2.0);
    in.bias = RandomVector<float>(l.c(), 4, -1.0, 1.0);
    in.mean = RandomVector<double>(l.c(), 5, -1.5, 1.5);
    in.invstd = RandomVector<double>(l.c(), 6, 0.3, 3.0);
    return in;
  }

  BackwardInputs MakeBackwardInputs(const Layout& l) {
    BackwardInputs in;
    in.dy = RandomTensor(l, 11, 0.2, 0.5);
    in.x = RandomTensor(l, 12);
    in.y = RandomTensor(l, 13);  // mixed signs: about half masked
    in.weight = RandomVector<float>(l.c(), 14, 0.5, 2.0);
    in.mean = RandomVector<double>(l.c(), 15, -1.5, 1.5);
    in.invstd = RandomVector<double>(l.c(), 16, 0.3, 3.0);
    in.mean_dy = RandomVector<double>(l.c(), 17, -0.2, 0.2);
    in.mean_dy_xmu = RandomVector<double>(l.c(), 18, -0.5, 0.5);
    return in;
  }

  std::unique_ptr<ThreadPool> pool_;
};

TEST_P(KernelTest, LocalMomentsMatchesTwoPassReference) {
  const Layout& l = GetParam();
  const std::vector<float> x = RandomTensor(l, 21);
  const reference::Stats ref = reference::Moments(l, x);
  for (int threads : {0, 3}) {
    Moments m = PoisonedMoments();
    ASSERT_TRUE(LocalMoments(Context(threads), DType::kFloat32, x.data(),
                             GeometryOf(l), &m)
                    .ok());
    EXPECT_EQ(m.count, ref.count);
    ExpectStatsClose(m.mean, ref.mean, "mean");
    ExpectStatsClose(m.m2, ref.m2, "m2");
    EXPECT_TRUE(ValidateMoments(m, static_cast<int>(l.c())).ok());
  }
}

TEST_P(KernelTest, ForwardMatchesReferenceForEveryOption) {
  const Layout& l = GetParam();
  const ForwardInputs in = MakeForwardInputs(l);
  for (int mask = 0; mask < 16; ++mask) {
    const bool use_w = mask & 1, use_b = mask & 2, use_z = mask & 4,
               relu = mask & 8;
    ForwardArgs args;
    std::vector<float> y(l.size(), kNaNf);
    args.x = in.x.data();
    args.y = y.data();
    args.z = use_z ? in.z.data() : nullptr;
    args.weight = use_w ? in.weight.data() : nullptr;
    args.bias = use_b ? in.bias.data() : nullptr;
    args.mean = in.mean.data();
    args.invstd = in.invstd.data();
    args.relu = relu;
    ASSERT_TRUE(
        Forward(Context(mask % 3), DType::kFloat32, GeometryOf(l), args).ok());
    ExpectClose(y, ReferenceForward(l, in, use_z, use_w, use_b, relu),
                kOutputTol,
                absl::StrCat("y(weight=", use_w, " bias=", use_b, " z=", use_z,
                             " relu=", relu, ")"));
  }
}

TEST_P(KernelTest, ForwardInPlaceEqualsOutOfPlace) {
  const Layout& l = GetParam();
  const ForwardInputs in = MakeForwardInputs(l);
  ForwardArgs args;
  std::vector<float> y(l.size(), kNaNf);
  args.x = in.x.data();
  args.y = y.data();
  args.z = in.z.data();
  args.weight = in.weight.data();
  args.bias = in.bias.data();
  args.mean = in.mean.data();
  args.invstd = in.invstd.data();
  args.relu = true;
  ASSERT_TRUE(Forward(Context(2), DType::kFloat32, GeometryOf(l), args).ok());
  std::vector<float> inplace = in.x;
  args.x = inplace.data();
  args.y = inplace.data();
  ASSERT_TRUE(Forward(Context(2), DType::kFloat32, GeometryOf(l), args).ok());
  EXPECT_EQ(0, std::memcmp(y.data(), inplace.data(), y.size() * sizeof(float)));
}

TEST_P(KernelTest, BackwardReduceMatchesReferenceWithAndWithoutMask) {
  const Layout& l = GetParam();
  const BackwardInputs in = MakeBackwardInputs(l);
  for (bool mask : {false, true}) {
    const reference::GradSumsRef ref = reference::BackwardSums(
        l, in.dy, in.x, MaskOf(in, mask), ToReals(in.mean));
    const LongVec &ref_dy = ref.sum_dy, &ref_dy_xmu = ref.sum_dy_xmu;
    BackwardReduceArgs args;
    args.dy = in.dy.data();
    args.x = in.x.data();
    args.y = mask ? in.y.data() : nullptr;
    args.mean = in.mean.data();
    args.invstd = in.invstd.data();
    GradSums sums = PoisonedSums();
    std::vector<double> grad_weight(l.c(), kNaN), grad_bias(l.c(), kNaN);
    ASSERT_TRUE(BackwardReduce(Context(mask ? 3 : 0), DType::kFloat32,
                               GeometryOf(l), args, &sums, grad_weight.data(),
                               grad_bias.data())
                    .ok());
    const std::string tag = mask ? " (masked)" : "";
    ExpectStatsClose(sums.sum_dy, ref_dy, "sum_dy" + tag);
    ExpectStatsClose(sums.sum_dy_xmu, ref_dy_xmu, "sum_dy_xmu" + tag);
    LongVec ref_gw(l.c());
    for (int64_t c = 0; c < l.c(); ++c)
      ref_gw[c] = ref_dy_xmu[c] * in.invstd[c];
    ExpectStatsClose(grad_weight, ref_gw, "grad_weight" + tag);
    ExpectStatsClose(grad_bias, ref_dy, "grad_bias" + tag);
    // The gradient outputs are optional.
    GradSums again = PoisonedSums();
    ASSERT_TRUE(BackwardReduce(Context(0), DType::kFloat32, GeometryOf(l), args,
                               &again, nullptr, nullptr)
                    .ok());
    EXPECT_EQ(again.sum_dy, sums.sum_dy);
  }
}

TEST_P(KernelTest, BackwardElementwiseMatchesReferenceForEveryOption) {
  const Layout& l = GetParam();
  const BackwardInputs in = MakeBackwardInputs(l);
  for (int mask = 0; mask < 8; ++mask) {
    const bool use_w = mask & 1, relu = mask & 2, want_z = mask & 4;
    BackwardElementwiseArgs args;
    std::vector<float> grad_input(l.size(), kNaNf), grad_z(l.size(), kNaNf);
    args.dy = in.dy.data();
    args.x = in.x.data();
    args.y = relu ? in.y.data() : nullptr;
    args.mean = in.mean.data();
    args.invstd = in.invstd.data();
    args.weight = use_w ? in.weight.data() : nullptr;
    args.mean_dy = in.mean_dy.data();
    args.mean_dy_xmu = in.mean_dy_xmu.data();
    args.grad_input = grad_input.data();
    args.grad_z = want_z ? grad_z.data() : nullptr;
    ASSERT_TRUE(BackwardElementwise(Context(mask % 3), DType::kFloat32,
                                    GeometryOf(l), args)
                    .ok());
    const std::string tag = absl::StrCat("(weight=", use_w, " relu=", relu,
                                         " grad_z=", want_z, ")");
    ExpectClose(grad_input, ReferenceGradInput(l, in, relu, use_w), kOutputTol,
                "grad_input" + tag);
    if (want_z) {
      LongVec ref_z(l.size());
      ForEachElement(l, [&](int64_t, int64_t i) {
        ref_z[i] = reference::MaskedDy(in.dy, MaskOf(in, relu), i);
      });
      ExpectClose(grad_z, ref_z, 0.0, "grad_z" + tag);
    } else {
      for (float v : grad_z) ASSERT_TRUE(std::isnan(v)) << "grad_z written";
    }
  }
}

// Shapes: every rank in both layouts, plus sizes that cross the kernels'
// internal splits (rows longer than a block, more channels than a tile,
// several tasks per channel, channels-last tasks of several row blocks with
// channel counts that use every SIMD column width: 24 = 16 + 8, 300 = 256 +
// 32 + 8 + 4).
INSTANTIATE_TEST_SUITE_P(
    Shapes, KernelTest,
    testing::Values(Layout{{9, 6}, false}, Layout{{9, 6}, true},
                    Layout{{4, 3, 33}, false}, Layout{{4, 33, 3}, true},
                    Layout{{3, 4, 5, 7}, false}, Layout{{3, 5, 7, 4}, true},
                    Layout{{2, 3, 4, 5, 6}, false},
                    Layout{{2, 4, 5, 6, 3}, true}, Layout{{1, 1, 1, 1}, false},
                    Layout{{3, 1, 1}, true}, Layout{{2, 2, 80, 60}, false},
                    Layout{{5, 3, 300}, true}, Layout{{40, 3, 32, 32}, false},
                    Layout{{16, 40, 40, 5}, true}, Layout{{24, 8, 520}, true},
                    Layout{{8, 64, 80, 24}, true},
                    Layout{{2, 30, 30, 300}, true},
                    Layout{{2, 7, 9, 11, 13}, false}),
    [](const testing::TestParamInfo<Layout>& info) {
      return info.param.Name();
    });

// ---- numerics and determinism ---------------------------------------------

// Catastrophic cancellation test: values around +-1e4 with unit spread, in
// the generic loops (2 channels) and the SIMD ones (32 channels
// channels-last, rows of 4096).
TEST(LocalMomentsTest, StableWhenMeanIsFarLargerThanStd) {
  for (const Layout& l :
       {Layout{{8, 2, 64, 64}, false}, Layout{{8, 64, 64, 2}, true},
        Layout{{40000, 2}, false}, Layout{{8, 64, 64, 32}, true},
        Layout{{4, 3, 64, 64}, false}}) {
    std::vector<float> x(l.size());
    std::mt19937_64 rng(31);
    std::normal_distribution<double> unit(0.0, 1.0);
    ForEachElement(l, [&](int64_t ch, int64_t i) {
      x[i] = static_cast<float>((ch == 0 ? 1e4 : -1e4) + unit(rng));
    });
    const reference::Stats ref = reference::Moments(l, x);
    Moments m = PoisonedMoments();
    ASSERT_TRUE(LocalMoments(KernelContext{}, DType::kFloat32, x.data(),
                             GeometryOf(l), &m)
                    .ok());
    for (int c = 0; c < l.c(); ++c) {
      const long double ref_var = ref.m2[c] / ref.count;
      const long double var = m.m2[c] / m.count;
      EXPECT_LT(std::fabs(var - ref_var) / ref_var, kStatsTol)
          << l.Name() << " channel " << c;
      EXPECT_LT(std::fabs(m.mean[c] - ref.mean[c]) / std::fabs(ref.mean[c]),
                1e-12)
          << l.Name() << " channel " << c;
    }
  }
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// All outputs of all four kernels for one pool size.
struct AllOutputs {
  Moments moments;
  GradSums sums;
  std::vector<double> grad_weight, grad_bias;
  std::vector<float> y, grad_input, grad_z;
};

AllOutputs RunAll(const Layout& l, ThreadPool* pool) {
  KernelContext ctx;
  ctx.pool = pool;
  const Geometry g = GeometryOf(l);
  const std::vector<float> x = RandomTensor(l, 41);
  const std::vector<float> dy = RandomTensor(l, 42, 0.1, 0.5);
  AllOutputs out;
  EXPECT_TRUE(
      LocalMoments(ctx, DType::kFloat32, x.data(), g, &out.moments).ok());
  const GlobalMoments stats = Finalize(out.moments);
  std::vector<double> invstd(l.c());
  for (int64_t c = 0; c < l.c(); ++c) invstd[c] = InvStd(stats.var[c], 1e-5);
  out.y.assign(l.size(), kNaNf);
  ForwardArgs fa;
  fa.x = x.data();
  fa.y = out.y.data();
  fa.mean = stats.mean.data();
  fa.invstd = invstd.data();
  fa.relu = true;
  EXPECT_TRUE(Forward(ctx, DType::kFloat32, g, fa).ok());
  BackwardReduceArgs ra{dy.data(), x.data(), out.y.data(), stats.mean.data(),
                        invstd.data()};
  out.grad_weight.assign(l.c(), kNaN);
  out.grad_bias.assign(l.c(), kNaN);
  EXPECT_TRUE(BackwardReduce(ctx, DType::kFloat32, g, ra, &out.sums,
                             out.grad_weight.data(), out.grad_bias.data())
                  .ok());
  std::vector<double> mean_dy(l.c()), mean_dy_xmu(l.c());
  for (int64_t c = 0; c < l.c(); ++c) {
    mean_dy[c] = out.sums.sum_dy[c] / out.moments.count;
    mean_dy_xmu[c] = out.sums.sum_dy_xmu[c] / out.moments.count;
  }
  out.grad_input.assign(l.size(), kNaNf);
  out.grad_z.assign(l.size(), kNaNf);
  BackwardElementwiseArgs ea;
  ea.dy = dy.data();
  ea.x = x.data();
  ea.y = out.y.data();
  ea.mean = stats.mean.data();
  ea.invstd = invstd.data();
  ea.mean_dy = mean_dy.data();
  ea.mean_dy_xmu = mean_dy_xmu.data();
  ea.grad_input = out.grad_input.data();
  ea.grad_z = out.grad_z.data();
  EXPECT_TRUE(BackwardElementwise(ctx, DType::kFloat32, g, ea).ok());
  return out;
}

TEST(DeterminismTest, ResultsAreBitwiseIdenticalForAnyPoolSize) {
  for (const Layout& l :
       {Layout{{40, 3, 32, 32}, false}, Layout{{16, 40, 40, 5}, true},
        Layout{{24, 8, 520}, true}, Layout{{3000, 7}, false},
        Layout{{2, 2, 80, 60}, false}, Layout{{8, 64, 80, 24}, true}}) {
    const AllOutputs serial = RunAll(l, nullptr);
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      const AllOutputs par = RunAll(l, &pool);
      const std::string where =
          absl::StrCat(l.Name(), ", ", threads, " threads");
      EXPECT_EQ(par.moments.count, serial.moments.count) << where;
      EXPECT_TRUE(BitwiseEqual(par.moments.mean, serial.moments.mean)) << where;
      EXPECT_TRUE(BitwiseEqual(par.moments.m2, serial.moments.m2)) << where;
      EXPECT_TRUE(BitwiseEqual(par.sums.sum_dy, serial.sums.sum_dy)) << where;
      EXPECT_TRUE(BitwiseEqual(par.sums.sum_dy_xmu, serial.sums.sum_dy_xmu))
          << where;
      EXPECT_TRUE(BitwiseEqual(par.grad_weight, serial.grad_weight)) << where;
      EXPECT_TRUE(BitwiseEqual(par.grad_bias, serial.grad_bias)) << where;
      EXPECT_TRUE(BitwiseEqual(par.y, serial.y)) << where;
      EXPECT_TRUE(BitwiseEqual(par.grad_input, serial.grad_input)) << where;
      EXPECT_TRUE(BitwiseEqual(par.grad_z, serial.grad_z)) << where;
    }
  }
}

// ---- empty batches ---------------------------------------------------------

TEST(EmptyBatchTest, CountZeroAndZerosWithNullTensors) {
  for (const Layout& l : {Layout{{0, 4}, false}, Layout{{0, 4, 5, 5}, false},
                          Layout{{0, 5, 5, 4}, true}, Layout{{3, 4, 0}, false},
                          Layout{{3, 0, 4}, true}}) {
    const Geometry g = GeometryOf(l);
    const std::vector<double> ones(4, 1.0);
    for (int threads : {0, 2}) {
      std::unique_ptr<ThreadPool> pool =
          threads ? std::make_unique<ThreadPool>(threads) : nullptr;
      KernelContext ctx;
      ctx.pool = pool.get();
      Moments m = PoisonedMoments();
      ASSERT_TRUE(LocalMoments(ctx, DType::kFloat32, nullptr, g, &m).ok())
          << l.Name();
      EXPECT_EQ(m.count, 0);
      EXPECT_EQ(m.mean, std::vector<double>(4, 0.0)) << l.Name();
      EXPECT_EQ(m.m2, std::vector<double>(4, 0.0)) << l.Name();
      EXPECT_TRUE(ValidateMoments(m, 4).ok());

      BackwardReduceArgs ra{nullptr, nullptr, nullptr, ones.data(),
                            ones.data()};
      GradSums sums = PoisonedSums();
      std::vector<double> gw(4, kNaN), gb(4, kNaN);
      ASSERT_TRUE(BackwardReduce(ctx, DType::kFloat32, g, ra, &sums, gw.data(),
                                 gb.data())
                      .ok());
      EXPECT_EQ(sums.sum_dy, std::vector<double>(4, 0.0));
      EXPECT_EQ(sums.sum_dy_xmu, std::vector<double>(4, 0.0));
      EXPECT_EQ(gw, std::vector<double>(4, 0.0));
      EXPECT_EQ(gb, std::vector<double>(4, 0.0));

      ForwardArgs fa;
      fa.mean = ones.data();
      fa.invstd = ones.data();
      EXPECT_TRUE(Forward(ctx, DType::kFloat32, g, fa).ok());
      BackwardElementwiseArgs ea;
      ea.mean = ea.invstd = ea.mean_dy = ea.mean_dy_xmu = ones.data();
      EXPECT_TRUE(BackwardElementwise(ctx, DType::kFloat32, g, ea).ok());
    }
  }
}

// ---- geometry --------------------------------------------------------------

void ExpectGeometry(std::vector<int64_t> shape, bool last, int64_t outer,
                    int64_t channels, int64_t inner) {
  absl::StatusOr<Geometry> g = MakeGeometry(shape, last);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->outer, outer) << absl::StrJoin(shape, "x") << " last=" << last;
  EXPECT_EQ(g->channels, channels) << absl::StrJoin(shape, "x");
  EXPECT_EQ(g->inner, inner) << absl::StrJoin(shape, "x");
}

TEST(MakeGeometryTest, EveryRankInBothLayouts) {
  ExpectGeometry({8, 3}, false, 8, 3, 1);
  ExpectGeometry({8, 3}, true, 8, 3, 1);
  ExpectGeometry({8, 3, 5}, false, 8, 3, 5);
  ExpectGeometry({8, 5, 3}, true, 40, 3, 1);
  ExpectGeometry({8, 3, 5, 7}, false, 8, 3, 35);
  ExpectGeometry({8, 5, 7, 3}, true, 280, 3, 1);
  ExpectGeometry({2, 3, 4, 5, 6}, false, 2, 3, 120);
  ExpectGeometry({2, 4, 5, 6, 3}, true, 240, 3, 1);
  ExpectGeometry({0, 3, 4, 4}, false, 0, 3, 16);
}

// ---- bad arguments and unsupported configurations -------------------------

struct Fixture {
  std::vector<float> t = std::vector<float>(24, 1.5f);
  std::vector<float> out = std::vector<float>(24, kNaNf);
  std::vector<double> pc = std::vector<double>(3, 0.5);
  Geometry g{2, 3, 4};
  Moments m;
  GradSums sums;

  ForwardArgs Fwd() {
    ForwardArgs a;
    a.x = t.data();
    a.y = out.data();
    a.mean = a.invstd = pc.data();
    return a;
  }
  BackwardReduceArgs Red() {
    return BackwardReduceArgs{t.data(), t.data(), nullptr, pc.data(),
                              pc.data()};
  }
  BackwardElementwiseArgs Elt() {
    BackwardElementwiseArgs a;
    a.dy = a.x = t.data();
    a.mean = a.invstd = a.mean_dy = a.mean_dy_xmu = pc.data();
    a.grad_input = out.data();
    return a;
  }
  // Every kernel with the given context, dtype and geometry.
  std::vector<absl::Status> All(const KernelContext& ctx, DType d,
                                const Geometry& geo) {
    return {LocalMoments(ctx, d, t.data(), geo, &m),
            Forward(ctx, d, geo, Fwd()),
            BackwardReduce(ctx, d, geo, Red(), &sums, nullptr, nullptr),
            BackwardElementwise(ctx, d, geo, Elt())};
  }
};

void ExpectCode(const absl::Status& s, absl::StatusCode code,
                const std::string& what) {
  EXPECT_EQ(s.code(), code) << what << ": " << s;
  EXPECT_FALSE(s.message().empty()) << what;
}

TEST(BadArgumentsTest, ValidFixtureIsAccepted) {
  Fixture f;
  for (const absl::Status& s : f.All(KernelContext{}, DType::kFloat32, f.g)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(BadArgumentsTest, MakeGeometryRejectsBadShapes) {
  const auto bad = [](std::vector<int64_t> shape, bool last) {
    ExpectCode(MakeGeometry(shape, last).status(),
               absl::StatusCode::kInvalidArgument,
               absl::StrCat(absl::StrJoin(shape, "x"), " last=", last));
  };
  bad({}, false);
  bad({8}, false);
  bad({1, 2, 3, 4, 5, 6}, false);
  bad({-1, 3}, false);
  bad({2, 3, -4}, false);
  bad({2, -4, 3}, true);
  bad({2, 0}, false);
  bad({2, 0}, true);
  bad({2, 0, 5}, false);
  bad({2, 5, 0}, true);
  bad({2, int64_t{1} << 40}, false);  // more channels than an int holds
  bad({int64_t{1} << 40, 3, int64_t{1} << 40}, false);  // overflow
  bad({int64_t{1} << 40, int64_t{1} << 40, 3}, true);
}

TEST(BadArgumentsTest, EveryKernelRejectsABadGeometry) {
  Fixture f;
  for (const Geometry& g :
       {Geometry{-1, 3, 4}, Geometry{2, 0, 4}, Geometry{2, -3, 4},
        Geometry{2, 3, -1}, Geometry{1, int64_t{1} << 40, 1},
        Geometry{int64_t{1} << 40, 3, int64_t{1} << 40}}) {
    for (const absl::Status& s : f.All(KernelContext{}, DType::kFloat32, g)) {
      ExpectCode(
          s, absl::StatusCode::kInvalidArgument,
          absl::StrCat("geometry ", g.outer, ",", g.channels, ",", g.inner));
    }
  }
}

TEST(BadArgumentsTest, EveryRequiredPointerIsChecked) {
  Fixture f;
  const KernelContext ctx;
  constexpr DType d = DType::kFloat32;
  std::vector<std::pair<std::string, std::function<absl::Status()>>> calls = {
      {"LocalMoments x",
       [&] { return LocalMoments(ctx, d, nullptr, f.g, &f.m); }},
      {"LocalMoments out",
       [&] { return LocalMoments(ctx, d, f.t.data(), f.g, nullptr); }},
  };
  const auto fwd = [&](const char* name, std::function<void(ForwardArgs&)> b) {
    calls.push_back({name, [&f, &ctx, b] {
                       ForwardArgs a = f.Fwd();
                       b(a);
                       return Forward(ctx, d, f.g, a);
                     }});
  };
  fwd("Forward x", [](ForwardArgs& a) { a.x = nullptr; });
  fwd("Forward y", [](ForwardArgs& a) { a.y = nullptr; });
  fwd("Forward mean", [](ForwardArgs& a) { a.mean = nullptr; });
  fwd("Forward invstd", [](ForwardArgs& a) { a.invstd = nullptr; });
  const auto red = [&](const char* name,
                       std::function<void(BackwardReduceArgs&)> b) {
    calls.push_back({name, [&f, &ctx, b] {
                       BackwardReduceArgs a = f.Red();
                       b(a);
                       return BackwardReduce(ctx, d, f.g, a, &f.sums, nullptr,
                                             nullptr);
                     }});
  };
  red("BackwardReduce dy", [](BackwardReduceArgs& a) { a.dy = nullptr; });
  red("BackwardReduce x", [](BackwardReduceArgs& a) { a.x = nullptr; });
  red("BackwardReduce mean", [](BackwardReduceArgs& a) { a.mean = nullptr; });
  red("BackwardReduce invstd",
      [](BackwardReduceArgs& a) { a.invstd = nullptr; });
  calls.push_back({"BackwardReduce sums", [&] {
                     return BackwardReduce(ctx, d, f.g, f.Red(), nullptr,
                                           nullptr, nullptr);
                   }});
  const auto elt = [&](const char* name,
                       std::function<void(BackwardElementwiseArgs&)> b) {
    calls.push_back({name, [&f, &ctx, b] {
                       BackwardElementwiseArgs a = f.Elt();
                       b(a);
                       return BackwardElementwise(ctx, d, f.g, a);
                     }});
  };
  using EA = BackwardElementwiseArgs;
  elt("BackwardElementwise dy", [](EA& a) { a.dy = nullptr; });
  elt("BackwardElementwise x", [](EA& a) { a.x = nullptr; });
  elt("BackwardElementwise grad_input", [](EA& a) { a.grad_input = nullptr; });
  elt("BackwardElementwise mean", [](EA& a) { a.mean = nullptr; });
  elt("BackwardElementwise invstd", [](EA& a) { a.invstd = nullptr; });
  elt("BackwardElementwise mean_dy", [](EA& a) { a.mean_dy = nullptr; });
  elt("BackwardElementwise mean_dy_xmu",
      [](EA& a) { a.mean_dy_xmu = nullptr; });
  for (const auto& [name, call] : calls) {
    ExpectCode(call(), absl::StatusCode::kInvalidArgument, name);
  }
  EXPECT_TRUE(std::all_of(f.out.begin(), f.out.end(), [](float v) {
    return std::isnan(v);
  })) << "a rejected call wrote its output";
}

TEST(BadArgumentsTest, UnknownDTypeAndDeviceAreInvalid) {
  Fixture f;
  for (const absl::Status& s :
       f.All(KernelContext{}, static_cast<DType>(7), f.g)) {
    ExpectCode(s, absl::StatusCode::kInvalidArgument, "dtype 7");
  }
  KernelContext ctx;
  ctx.device = static_cast<Device>(5);
  for (const absl::Status& s : f.All(ctx, DType::kFloat32, f.g)) {
    ExpectCode(s, absl::StatusCode::kInvalidArgument, "device 5");
  }
}

TEST(UnsupportedTest, CudaWithHostTensorsFailsClearlyAndWritesNothing) {
  // Without CUDA in the build: UNIMPLEMENTED; with CUDA but no usable
  // device: FAILED_PRECONDITION; with a device: INVALID_ARGUMENT (host
  // memory). Never a crash, never a write.
  Fixture f;
  KernelContext cuda;
  cuda.device = Device::kCuda;
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const absl::Status& s : f.All(cuda, d, f.g)) {
      EXPECT_TRUE(s.code() == absl::StatusCode::kUnimplemented ||
                  s.code() == absl::StatusCode::kFailedPrecondition ||
                  s.code() == absl::StatusCode::kInvalidArgument)
          << s;
      EXPECT_FALSE(s.message().empty());
    }
  }
  EXPECT_TRUE(std::all_of(f.out.begin(), f.out.end(), [](float v) {
    return std::isnan(v);
  })) << "a failed call wrote its output";
  EXPECT_EQ(f.m.count, 0) << "a failed call wrote its moments";
}

}  // namespace
}  // namespace syncnorm
