// bench-kernels: GB/s of the CPU kernels (//kernels:batch_norm, fp32, a
// ThreadPool of --threads) against a vectorized read loop and memcpy over the
// same bytes, measured in the same run on the same threads. Prints
//   KERNEL <layout> <op> <GB/s> <best seconds>
// Bytes counted: moments reads x; forward reads x, writes y; backward_reduce
// reads dy, x; backward_elementwise reads dy, x, writes dx; read reads x;
// memcpy reads x, writes y.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/batch_norm.h"
#include "kernels/moments.h"
#include "kernels/thread_pool.h"

ABSL_FLAG(int, n, 32, "batch");
ABSL_FLAG(int, c, 128, "channels");
ABSL_FLAG(int, hw, 56, "height = width");
ABSL_FLAG(int, threads, 2, "threads (pool size, caller included)");
ABSL_FLAG(int, reps, 10, "repetitions; the best is reported");

namespace syncnorm::bench {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench-kernels: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

template <typename Fn>
double Best(Fn fn) {
  const int reps = absl::GetFlag(FLAGS_reps);
  fn();  // warm caches and page tables
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const absl::Time t0 = absl::Now();
    fn();
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return best;
}

void Report(const char* layout, const char* op, double bytes, double secs) {
  std::printf("KERNEL %s %s %.3f %.9f\n", layout, op, bytes / secs / 1e9, secs);
  std::fflush(stdout);
}

// The read-bandwidth reference: the sum of [p, p + n) with the widest
// vectors the CPU has (AVX2: 4 independent 8-lane accumulators, so the
// loop is bound by loads, not by add latency), else SSE2 the same way.
__attribute__((target("avx2"))) double SumAvx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes,
                   _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double s = 0;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

double SumSse2(const float* p, size_t n) {
  __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm_add_ps(a0, _mm_loadu_ps(p + i));
    a1 = _mm_add_ps(a1, _mm_loadu_ps(p + i + 4));
    a2 = _mm_add_ps(a2, _mm_loadu_ps(p + i + 8));
    a3 = _mm_add_ps(a3, _mm_loadu_ps(p + i + 12));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)));
  double s = 0;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

// Splits [0, n) into pool.size() chunks.
template <typename Fn>
void Chunks(ThreadPool& pool, size_t n, Fn fn) {
  const int k = pool.size();
  pool.ParallelFor(k, [&](int64_t t) {
    const size_t lo = n * t / k, hi = n * (t + 1) / k;
    fn(lo, hi);
  });
}

}  // namespace
}  // namespace syncnorm::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace syncnorm;         // NOLINT
  using namespace syncnorm::bench;  // NOLINT
  const int64_t n = absl::GetFlag(FLAGS_n), c = absl::GetFlag(FLAGS_c),
                hw = absl::GetFlag(FLAGS_hw);
  const size_t elems = n * c * hw * hw;
  const double bytes = 4.0 * elems;
  ThreadPool pool(absl::GetFlag(FLAGS_threads));
  std::vector<float> x(elems), y(elems), dy(elems), dx(elems);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(3.0f, 2.0f);
  for (size_t i = 0; i < elems; ++i)
    x[i] = normal(rng), dy[i] = normal(rng) - 3.0f;

  // References: a vectorized read loop and memcpy, split like the kernels.
  std::vector<double> partial(pool.size());
  const bool avx2 = __builtin_cpu_supports("avx2");
  const double t_read = Best([&] {
    pool.ParallelFor(pool.size(), [&](int64_t t) {
      const size_t lo = elems * t / pool.size();
      const size_t hi = elems * (t + 1) / pool.size();
      partial[t] = avx2 ? SumAvx2(x.data() + lo, hi - lo)
                        : SumSse2(x.data() + lo, hi - lo);
    });
  });
  const double t_memcpy = Best([&] {
    Chunks(pool, elems, [&](size_t lo, size_t hi) {
      std::memcpy(y.data() + lo, x.data() + lo, (hi - lo) * sizeof(float));
    });
  });
  Report("-", "read", bytes, t_read);
  Report("-", "memcpy", 2 * bytes, t_memcpy);

  KernelContext ctx;
  ctx.pool = &pool;
  std::vector<float> weight(c, 1.5f), bias(c, 0.25f);
  for (bool channels_last : {false, true}) {
    const char* layout = channels_last ? "NHWC" : "NCHW";
    std::vector<int64_t> shape = channels_last
                                     ? std::vector<int64_t>{n, hw, hw, c}
                                     : std::vector<int64_t>{n, c, hw, hw};
    auto g = MakeGeometry(shape, channels_last);
    Check(g.status());
    Moments m;
    const double t_moments = Best(
        [&] { Check(LocalMoments(ctx, DType::kFloat32, x.data(), *g, &m)); });
    const GlobalMoments global = Finalize(m);
    std::vector<double> mean = global.mean, invstd(c);
    for (int i = 0; i < c; ++i)
      invstd[i] = 1.0 / std::sqrt(global.var[i] + 1e-5);
    ForwardArgs fa;
    fa.x = x.data();
    fa.y = y.data();
    fa.weight = weight.data();
    fa.bias = bias.data();
    fa.mean = mean.data();
    fa.invstd = invstd.data();
    const double t_forward =
        Best([&] { Check(Forward(ctx, DType::kFloat32, *g, fa)); });
    BackwardReduceArgs ra;
    ra.dy = dy.data();
    ra.x = x.data();
    ra.mean = mean.data();
    ra.invstd = invstd.data();
    GradSums sums;
    std::vector<double> gw(c), gb(c);
    const double t_reduce = Best([&] {
      Check(BackwardReduce(ctx, DType::kFloat32, *g, ra, &sums, gw.data(),
                           gb.data()));
    });
    std::vector<double> mean_dy(c), mean_dy_xmu(c);
    const double count = static_cast<double>(g->per_channel());
    for (int i = 0; i < c; ++i) {
      mean_dy[i] = sums.sum_dy[i] / count;
      mean_dy_xmu[i] = sums.sum_dy_xmu[i] / count;
    }
    BackwardElementwiseArgs ea;
    ea.dy = dy.data();
    ea.x = x.data();
    ea.mean = mean.data();
    ea.invstd = invstd.data();
    ea.weight = weight.data();
    ea.mean_dy = mean_dy.data();
    ea.mean_dy_xmu = mean_dy_xmu.data();
    ea.grad_input = dx.data();
    const double t_elem =
        Best([&] { Check(BackwardElementwise(ctx, DType::kFloat32, *g, ea)); });
    Report(layout, "moments", bytes, t_moments);
    Report(layout, "forward", 2 * bytes, t_forward);
    Report(layout, "backward_reduce", 2 * bytes, t_reduce);
    Report(layout, "backward_elementwise", 3 * bytes, t_elem);
    Report(layout, "backward", 5 * bytes, t_reduce + t_elem);
  }
  double s = 0;
  for (double p : partial) s += p;
  std::fprintf(stderr, "(checksum %g)\n", s);
  return 0;
}
