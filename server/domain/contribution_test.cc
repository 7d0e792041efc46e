#include "server/domain/contribution.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace {

Payload MomentsPayload(int64_t count, std::vector<double> mean,
                       std::vector<double> m2) {
  Moments m;
  m.count = count;
  m.mean = std::move(mean);
  m.m2 = std::move(m2);
  return m;
}

// Rounds stored by older builds carry FNV-1a fingerprints: the function
// must still give exactly what those builds stored.
TEST(PayloadFingerprintTest, Fnv1aMatchesWhatOlderBuildsStored) {
  const Payload p = MomentsPayload(3, {1.5, -0.0}, {2.25, 1e300});
  EXPECT_EQ(PayloadFingerprint(p, FingerprintKind::kFnv1a),
            0xc1a948494019593eULL);
}

TEST(PayloadFingerprintTest, KindsDiffer) {
  const Payload p = MomentsPayload(3, {1.5, -0.0}, {2.25, 1e300});
  EXPECT_EQ(PayloadFingerprint(p), PayloadFingerprint(p, kFingerprintKind));
  EXPECT_NE(PayloadFingerprint(p, FingerprintKind::kFnv1a),
            PayloadFingerprint(p, FingerprintKind::kWordLanes));
}

TEST(PayloadFingerprintTest, WordLanesSeeEveryBitAndPosition) {
  std::vector<double> mean(37), m2(37);
  for (int i = 0; i < 37; ++i) {
    mean[i] = 0.25 * i - 3;
    m2[i] = 1.0 + i;
  }
  const uint64_t base = PayloadFingerprint(MomentsPayload(8, mean, m2));
  EXPECT_EQ(base, PayloadFingerprint(MomentsPayload(8, mean, m2)));
  EXPECT_NE(base, PayloadFingerprint(MomentsPayload(9, mean, m2)));
  for (int i = 0; i < 37; ++i) {
    std::vector<double> changed = m2;
    changed[i] = std::nextafter(changed[i], 1e9);
    EXPECT_NE(base, PayloadFingerprint(MomentsPayload(8, mean, changed)))
        << "m2[" << i << "]";
  }
  std::vector<double> swapped = mean;
  std::swap(swapped[4], swapped[8]);  // same lane, different place
  EXPECT_NE(base, PayloadFingerprint(MomentsPayload(8, swapped, m2)));
  // The same words split differently between the two vectors.
  EXPECT_NE(PayloadFingerprint(MomentsPayload(1, {1.0, 2.0}, {3.0})),
            PayloadFingerprint(MomentsPayload(1, {1.0}, {2.0, 3.0})));
  EXPECT_NE(PayloadFingerprint(MomentsPayload(1, {0.0}, {0.0})),
            PayloadFingerprint(MomentsPayload(1, {-0.0}, {0.0})));
  GradSums g;
  g.sum_dy = {0.0};
  g.sum_dy_xmu = {0.0};
  EXPECT_NE(PayloadFingerprint(Payload(g)), PayloadFingerprint(Payload()));
  EXPECT_NE(PayloadFingerprint(Payload(g)),
            PayloadFingerprint(MomentsPayload(0, {0.0}, {0.0})));
}

}  // namespace
}  // namespace syncnorm
