// The synthetic model of the demo and the system tests: a stack of BN
// layers joined by fixed 1x1 convolutions, fed a deterministic batch that is
// split unevenly over the ranks.
//
// Layer l: y_l = BN_l(x_l) (ReLU), x_{l+1} = float(Mix_l y_l) where Mix_l is
// a fixed C_{l+1} x C_l matrix applied at every (sample, position). The loss
// is sum(G * y_last) for a fixed G, so dy_last = G and dy_l =
// float(Mix_l^T dx_{l+1}). Every value is a pure function of the seed and its
// global coordinates, so any process can produce any rank's shard.
#ifndef SYNCNORM_TESTS_TESTING_STACK_MODEL_H_
#define SYNCNORM_TESTS_TESTING_STACK_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/formulas.h"

namespace syncnorm::testing {

struct StackConfig {
  int world_size = 4;     // ranks (workers) of the job
  int group_size = 0;     // 0: one group of world_size
  int global_batch = 32;  // samples per step over all ranks
  std::vector<int> channels = {16, 16, 32};
  std::vector<int64_t> spatial = {6, 6};  // 0 to 3 dimensions
  bool channels_last = false;
  bool fuse_relu = true;
  int steps = 5;
  uint64_t seed = 1;
  MomentumMode mode = MomentumMode::kTorch;
  double momentum = 0.1;  // resolved (never "default")
  bool biased_running_var = false;
  double eps = 1e-5;

  int layers() const { return static_cast<int>(channels.size()); }
  int64_t positions() const;  // product of spatial
  int group_of(int rank) const;
  int ranks_per_group() const;
};

// Samples of each rank at a step: uneven, and on every third step the last
// rank of each group has none (its share goes to the group's first rank).
std::vector<int> ShardSizes(const StackConfig& config, int64_t step);
// Index of rank's first sample within the step's global batch.
int ShardOffset(const StackConfig& config, int64_t step, int rank);

// The layer-0 input value of (global sample, channel, position).
float InputValue(const StackConfig& config, int64_t step, int64_t sample, int c,
                 int64_t pos);
// dL/dy of the last layer at (global sample, channel, position).
float LossGrad(const StackConfig& config, int64_t step, int64_t sample, int c,
               int64_t pos);
// Mix_l[c_out][c_in].
double MixWeight(const StackConfig& config, int layer, int c_out, int c_in);
float Gamma(const StackConfig& config, int layer, int c);
float Beta(const StackConfig& config, int layer, int c);

// Offset of (sample, channel, position) in a tensor of `channels` channels.
inline int64_t Index(const StackConfig& config, int channels, int64_t n, int c,
                     int64_t pos) {
  const int64_t p = config.positions();
  return config.channels_last ? (n * p + pos) * channels + c
                              : (n * channels + c) * p + pos;
}

// The tensor shape of n samples of a layer with `channels` channels.
std::vector<int64_t> Shape(const StackConfig& config, int64_t n, int channels);

// x_{l+1} = float(Mix_l y) for n samples (in the configured layout).
std::vector<float> MixForward(const StackConfig& config, int layer, int64_t n,
                              const std::vector<float>& y);
// dy_l = float(Mix_l^T dx) for n samples.
std::vector<float> MixBackward(const StackConfig& config, int layer, int64_t n,
                               const std::vector<float>& dx_next);

// The flags that pass a config to a worker process, and their parser.
std::vector<std::string> ToFlags(const StackConfig& config);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_STACK_MODEL_H_
