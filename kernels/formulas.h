// The numerics of synchronized batch norm, once.
//
// Scalar inline functions usable from host code and (when compiled by nvcc)
// device code. Every merge, finalize and running-statistics update in the
// kernels, the client and the server goes through these, so the CPU, the GPU
// and the service agree bit for bit on the same inputs.
#ifndef SYNCNORM_KERNELS_FORMULAS_H_
#define SYNCNORM_KERNELS_FORMULAS_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SYNCNORM_HD __host__ __device__ __forceinline__
#else
#define SYNCNORM_HD inline
#endif

namespace syncnorm {

// Running-statistics update rule of a layer. Values match the wire enum
// syncnorm.v1.MomentumMode.
enum class MomentumMode : int {
  kTorch = 1,       // running = (1 - m) * running + m * batch
  kDecay = 2,       // running = m * running + (1 - m) * batch
  kCumulative = 3,  // running += (batch - running) / num_batches_tracked
};

// Chan et al. pairwise merge of one channel: folds (nb, mean_b, m2_b) into
// (na, mean_a, m2_a). Counts are carried as T so that device code can merge
// in float; n = 0 on either side is exact (the other side is kept as is).
template <typename T>
SYNCNORM_HD void ChanMerge(T& na, T& mean_a, T& m2_a, T nb, T mean_b, T m2_b) {
  if (nb == T(0)) return;
  if (na == T(0)) {
    na = nb;
    mean_a = mean_b;
    m2_a = m2_b;
    return;
  }
  const T n = na + nb;
  const T d = mean_b - mean_a;
  const T wb = nb / n;
  mean_a = mean_a + d * wb;
  m2_a = m2_a + m2_b + d * d * na * wb;
  na = n;
}

// Welford's one-pass update with a single value x.
template <typename T>
SYNCNORM_HD void WelfordAdd(T& n, T& mean, T& m2, T x) {
  n = n + T(1);
  const T d = x - mean;
  mean = mean + d / n;
  m2 = m2 + d * (x - mean);
}

// Biased variance M2 / n used for normalization; 0 when n == 0.
SYNCNORM_HD double BiasedVar(double n, double m2) {
  return n > 0 ? m2 / n : 0.0;
}

// Variance that enters the running statistics, from the biased batch var:
// var * n/(n-1) (as torch does) unless biased. Taking the biased var as input
// lets a client that only sees the global (n, mean, var) reproduce the
// server's running statistics bit for bit.
// REQUIRES: n > 1 when !biased (callers reject n == 1 first).
SYNCNORM_HD double RunningVarSample(double n, double biased_var, bool biased) {
  return biased ? biased_var : biased_var * (n / (n - 1.0));
}

// 1 / sqrt(var + eps), in double.
SYNCNORM_HD double InvStd(double var, double eps) {
  return 1.0 / std::sqrt(var + eps);
}

// Updates one running value with one batch value.
// num_batches_tracked is the count *after* this batch (>= 1); used only by
// kCumulative. momentum is the resolved value (see DefaultMomentum).
SYNCNORM_HD double UpdateRunning(MomentumMode mode, double momentum,
                                 double running, double batch,
                                 int64_t num_batches_tracked) {
  switch (mode) {
    case MomentumMode::kDecay:
      return momentum * running + (1.0 - momentum) * batch;
    case MomentumMode::kCumulative:
      return running +
             (batch - running) / static_cast<double>(num_batches_tracked);
    case MomentumMode::kTorch:
    default:
      return (1.0 - momentum) * running + momentum * batch;
  }
}

// The momentum a mode uses when none is given (0): torch's 0.1, MegEngine's
// and MXNet's 0.9; cumulative ignores it.
SYNCNORM_HD double DefaultMomentum(MomentumMode mode) {
  return mode == MomentumMode::kDecay ? 0.9 : 0.1;
}

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_FORMULAS_H_
