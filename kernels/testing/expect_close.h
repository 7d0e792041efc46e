// gtest comparisons of results with the float64 reference
// (batch_norm_reference.h). Test-only.
#ifndef SYNCNORM_KERNELS_TESTING_EXPECT_CLOSE_H_
#define SYNCNORM_KERNELS_TESTING_EXPECT_CLOSE_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm::reference {

// max |v[i]|; 0 for an empty v.
inline Real MaxAbs(const Reals& v) {
  Real m = 0;
  for (Real x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Every got[i] within rel * max |ref| of ref[i]; a NaN (say, an unwritten
// element) fails. Reports the first 5 elements off, each with `what`.
template <typename T>
void ExpectClose(const std::vector<T>& got, const Reals& ref, double rel,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Real tol = rel * std::max(MaxAbs(ref), 1e-30L);
  int reported = 0;
  for (size_t i = 0; i < ref.size() && reported < 5; ++i) {
    const Real diff = std::fabs(got[i] - ref[i]);
    if (!(diff <= tol)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference "
                    << static_cast<double>(ref[i]) << ", tolerance "
                    << static_cast<double>(tol);
      ++reported;
    }
  }
}

}  // namespace syncnorm::reference

#endif  // SYNCNORM_KERNELS_TESTING_EXPECT_CLOSE_H_
