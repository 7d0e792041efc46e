#include "tests/testing/stack_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace syncnorm::testing {
namespace {

// splitmix64: a counter-based generator, so values need no shared state.
uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d,
              uint64_t e) {
  uint64_t h = Mix64(seed);
  for (uint64_t v : {a, b, c, d, e}) h = Mix64(h ^ v);
  return h;
}

// Uniform in [-1, 1).
double Uniform(uint64_t h) {
  return static_cast<double>(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Roughly normal: the sum of four uniforms, scaled to unit variance.
double Normal(uint64_t h) {
  double s = 0;
  for (int i = 0; i < 4; ++i) {
    h = Mix64(h);
    s += Uniform(h);
  }
  return s * std::sqrt(3.0 / 4.0);
}

}  // namespace

int64_t StackConfig::positions() const {
  int64_t p = 1;
  for (int64_t d : spatial) p *= d;
  return p;
}

int StackConfig::ranks_per_group() const {
  return group_size > 0 ? group_size : world_size;
}

int StackConfig::group_of(int rank) const { return rank / ranks_per_group(); }

std::vector<int> ShardSizes(const StackConfig& config, int64_t step) {
  const int k = config.ranks_per_group();
  const int groups = config.world_size / k;
  std::vector<int> sizes(config.world_size, 0);
  const int per_group = config.global_batch / groups;
  for (int g = 0; g < groups; ++g) {
    // Weights 1, 2, ..., k rotated by the step: every rank's size changes.
    int total_weight = k * (k + 1) / 2;
    int given = 0;
    for (int i = 0; i < k; ++i) {
      const int w = 1 + static_cast<int>((i + step) % k);
      const int n =
          (i == k - 1) ? per_group - given : per_group * w / total_weight;
      sizes[g * k + i] = n;
      given += n;
    }
    if (step % 3 == 1 && k > 1) {  // an empty shard
      sizes[g * k] += sizes[g * k + k - 1];
      sizes[g * k + k - 1] = 0;
    }
  }
  return sizes;
}

int ShardOffset(const StackConfig& config, int64_t step, int rank) {
  const std::vector<int> sizes = ShardSizes(config, step);
  int offset = 0;
  for (int r = 0; r < rank; ++r) offset += sizes[r];
  return offset;
}

float InputValue(const StackConfig& config, int64_t step, int64_t sample, int c,
                 int64_t pos) {
  const double noise = Normal(Hash(config.seed, 1, step, sample, c, pos));
  // Channel means far from zero and unequal scales: the moments must be
  // computed stably.
  const double mean = 2.0 + 3.0 * (c % 5);
  const double scale = 0.5 + 0.25 * (c % 3);
  return static_cast<float>(mean + scale * noise);
}

float LossGrad(const StackConfig& config, int64_t step, int64_t sample, int c,
               int64_t pos) {
  return static_cast<float>(
      Uniform(Hash(config.seed, 2, step, sample, c, pos)));
}

double MixWeight(const StackConfig& config, int layer, int c_out, int c_in) {
  const int fan_in = config.channels[layer];
  return Uniform(Hash(config.seed, 3, layer, c_out, c_in, 0)) /
         std::sqrt(static_cast<double>(fan_in));
}

float Gamma(const StackConfig& config, int layer, int c) {
  return static_cast<float>(
      1.0 + 0.25 * Uniform(Hash(config.seed, 4, layer, c, 0, 0)));
}

float Beta(const StackConfig& config, int layer, int c) {
  return static_cast<float>(0.2 *
                            Uniform(Hash(config.seed, 5, layer, c, 0, 0)));
}

std::vector<int64_t> Shape(const StackConfig& config, int64_t n, int channels) {
  std::vector<int64_t> shape = {n};
  if (!config.channels_last) shape.push_back(channels);
  shape.insert(shape.end(), config.spatial.begin(), config.spatial.end());
  if (config.channels_last) shape.push_back(channels);
  return shape;
}

namespace {

// Mix_l as a dense C_{l+1} x C_l matrix.
std::vector<double> MixMatrix(const StackConfig& config, int layer) {
  const int cin = config.channels[layer];
  const int cout = config.channels[layer + 1];
  std::vector<double> w(cout * cin);
  for (int co = 0; co < cout; ++co)
    for (int ci = 0; ci < cin; ++ci)
      w[co * cin + ci] = MixWeight(config, layer, co, ci);
  return w;
}

// out[o] = float(sum_i w(o, i) * in[i]) at every (sample, position).
std::vector<float> Apply(const StackConfig& config, int64_t n, int cin,
                         int cout, const std::vector<float>& in,
                         const std::vector<double>& w, bool transpose) {
  const int64_t p = config.positions();
  std::vector<float> out(n * cout * p);
  std::vector<double> column(cin);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t q = 0; q < p; ++q) {
      for (int i = 0; i < cin; ++i) column[i] = in[Index(config, cin, s, i, q)];
      for (int o = 0; o < cout; ++o) {
        double acc = 0;
        for (int i = 0; i < cin; ++i) {
          acc += (transpose ? w[i * cout + o] : w[o * cin + i]) * column[i];
        }
        out[Index(config, cout, s, o, q)] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<float> MixForward(const StackConfig& config, int layer, int64_t n,
                              const std::vector<float>& y) {
  return Apply(config, n, config.channels[layer], config.channels[layer + 1], y,
               MixMatrix(config, layer), false);
}

std::vector<float> MixBackward(const StackConfig& config, int layer, int64_t n,
                               const std::vector<float>& dx_next) {
  return Apply(config, n, config.channels[layer + 1], config.channels[layer],
               dx_next, MixMatrix(config, layer), true);
}

std::vector<std::string> ToFlags(const StackConfig& config) {
  return {
      absl::StrCat("--world_size=", config.world_size),
      absl::StrCat("--group_size=", config.group_size),
      absl::StrCat("--global_batch=", config.global_batch),
      absl::StrCat("--channels=", absl::StrJoin(config.channels, ",")),
      absl::StrCat("--spatial=", absl::StrJoin(config.spatial, ",")),
      absl::StrCat("--channels_last=", config.channels_last ? "true" : "false"),
      absl::StrCat("--fuse_relu=", config.fuse_relu ? "true" : "false"),
      absl::StrCat("--steps=", config.steps),
      absl::StrCat("--seed=", config.seed),
      absl::StrCat("--momentum_mode=", static_cast<int>(config.mode)),
      absl::StrFormat("--momentum=%.17g", config.momentum),
      absl::StrCat("--biased_running_var=",
                   config.biased_running_var ? "true" : "false"),
      absl::StrFormat("--eps=%.17g", config.eps),
  };
}

}  // namespace syncnorm::testing
