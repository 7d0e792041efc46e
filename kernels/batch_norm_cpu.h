// The CPU kernels behind batch_norm.h, for element type T = float, Half or
// BFloat16 (half.h); every value is widened to double on load.
//
// REQUIRES for all: arguments validated by batch_norm.cc (a valid geometry;
// required pointers non-null, tensor pointers possibly null only when
// g.elements() == 0); tensors hold T.
#ifndef SYNCNORM_KERNELS_BATCH_NORM_CPU_H_
#define SYNCNORM_KERNELS_BATCH_NORM_CPU_H_

#include "kernels/batch_norm.h"
#include "kernels/half.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace cpu {

// Instantiated in the .cc files for float, Half and BFloat16.
template <typename T>
void LocalMoments(ThreadPool* pool, const T* x, const Geometry& g,
                  Moments* out);

template <typename T>
void Forward(ThreadPool* pool, const Geometry& g, const ForwardArgs& args);

template <typename T>
void BackwardReduce(ThreadPool* pool, const Geometry& g,
                    const BackwardReduceArgs& args, GradSums* sums,
                    double* grad_weight, double* grad_bias);

template <typename T>
void BackwardElementwise(ThreadPool* pool, const Geometry& g,
                         const BackwardElementwiseArgs& args);

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_CPU_H_
