// Options of the SyncBatchNorm layer: the union of torch, apex, MegEngine
// and MXNet's synchronized batch norm.
#ifndef SYNCNORM_CLIENT_SYNC_BATCH_NORM_OPTIONS_H_
#define SYNCNORM_CLIENT_SYNC_BATCH_NORM_OPTIONS_H_

#include <vector>

#include "kernels/formulas.h"

namespace syncnorm {

struct SyncBatchNormOptions {
  // Channels C. 0: inferred from the first forward's input (MXNet
  // in_channels=0); the job's LayerSpec must still name the real C.
  int num_features = 0;

  // Added to the variance before the square root. Default 1e-5.
  double eps = 1e-5;

  // Running-statistics rule: kTorch (torch, apex), kDecay (MegEngine,
  // MXNet) or kCumulative (torch momentum=None). Default kTorch.
  MomentumMode momentum_mode = MomentumMode::kTorch;

  // The rule's momentum; negative: the rule's default (0.1 torch, 0.9 decay).
  double momentum = -1;

  // Learnable shift beta (torch affine, MXNet center). Default true.
  bool center = true;
  // Learnable scale gamma (torch affine, MXNet scale). Default true.
  bool scale = true;

  // Keep running statistics (torch track_running_stats). Default true.
  bool track_running_stats = true;

  // Running var from the biased M2/n (MXNet, MegEngine's default is torch's
  // unbiased n/(n-1)). Default false: unbiased, like torch.
  bool biased_running_var = false;

  // MegEngine freeze: normalize with the running statistics in training
  // too, without a round and without updating them, and freeze gamma and
  // beta as well (grad_weight and grad_bias are zero). Default false.
  bool freeze = false;

  // MXNet use_global_stats: normalize with the running statistics in
  // training too, without a round and without updating them; gamma and
  // beta still get gradients. Default false.
  bool use_global_stats = false;

  // Input is channels-last (N, *spatial, C) (apex channel_last). 2-D input
  // is (N, C) either way. Default false.
  bool channels_last = false;

  // Apply ReLU after the (optional) residual add (apex fuse_relu).
  bool fuse_relu = false;

  // Initial gamma and beta (MXNet gamma_initializer / beta_initializer).
  float gamma_init = 1.0f;
  float beta_init = 0.0f;

  // Initial running statistics; empty: zeros and ones. Else C values each.
  std::vector<double> initial_running_mean;
  std::vector<double> initial_running_var;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_SYNC_BATCH_NORM_OPTIONS_H_
