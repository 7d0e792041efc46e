// The float32 CPU kernels behind batch_norm.h.
//
// REQUIRES for all: arguments validated by batch_norm.cc (a valid geometry;
// required pointers non-null, tensor pointers possibly null only when
// g.elements() == 0); tensors are float.
#ifndef SYNCNORM_KERNELS_BATCH_NORM_CPU_H_
#define SYNCNORM_KERNELS_BATCH_NORM_CPU_H_

#include "kernels/batch_norm.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace cpu {

void LocalMomentsF32(ThreadPool* pool, const float* x, const Geometry& g,
                     Moments* out);

void ForwardF32(ThreadPool* pool, const Geometry& g, const ForwardArgs& args);

void BackwardReduceF32(ThreadPool* pool, const Geometry& g,
                       const BackwardReduceArgs& args, GradSums* sums,
                       double* grad_weight, double* grad_bias);

void BackwardElementwiseF32(ThreadPool* pool, const Geometry& g,
                            const BackwardElementwiseArgs& args);

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_CPU_H_
