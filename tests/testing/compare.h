// Compares the workers' outputs with the float64 reference.
#ifndef SYNCNORM_TESTS_TESTING_COMPARE_H_
#define SYNCNORM_TESTS_TESTING_COMPARE_H_

#include <string>
#include <vector>

#include "tests/testing/reference.h"
#include "tests/testing/stack_worker.h"

namespace syncnorm::testing {

struct Comparison {
  double worst = 0;        // the worst relative error of any quantity
  std::string worst_what;  // which quantity that was
  int ranks_seen = 0;      // data ranks present in the outputs
};

// Relative errors (RelativeError) of every rank's forward output and input
// gradient of every layer at the last step, and of every layer's running
// mean and var (per group) at the end. A missing rank or a num_batches_tracked
// that differs from the reference's makes `worst` infinite.
Comparison Compare(const StackConfig& config, const ReferenceResult& ref,
                   const std::vector<RankOutput>& outputs);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_COMPARE_H_
