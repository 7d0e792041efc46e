// A float64 reference of the stack model: plain batch norm over each group's
// concatenated batch, by the tests' one batch-norm reference
// (kernels/testing/batch_norm_reference.h), between the model's own mixing
// layers.
#ifndef SYNCNORM_TESTS_TESTING_REFERENCE_H_
#define SYNCNORM_TESTS_TESTING_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "tests/testing/stack_model.h"

namespace syncnorm::testing {

struct ReferenceStats {
  int64_t num_batches_tracked = 0;
  std::vector<double> mean, var;
};

struct ReferenceResult {
  // Last step: [layer][rank] values of y and grad_input of the rank's shard,
  // in the configured layout.
  std::vector<std::vector<std::vector<double>>> y, dx;
  // Running statistics after the last step: [group][layer].
  std::vector<std::vector<ReferenceStats>> running;
};

// Replays every step. Statistics and normalization are float64; activations
// are rounded to float where the model stores them (x, y, dy, dx), so the
// replay follows the workers' path instead of drifting from it.
ReferenceResult RunReference(const StackConfig& config);

// max |a - b| / max |b| over the values (0 when b is all zero and a == b).
double RelativeError(const std::vector<double>& a,
                     const std::vector<double>& b);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_REFERENCE_H_
