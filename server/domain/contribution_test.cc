#include "server/domain/contribution.h"

#include <cmath>
#include <cstdint>
#include <cstring>
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
  EXPECT_EQ(kFingerprintKind, FingerprintKind::kHalfWordLanes);
  EXPECT_NE(PayloadFingerprint(p, FingerprintKind::kFnv1a),
            PayloadFingerprint(p, FingerprintKind::kWordLanes));
  EXPECT_NE(PayloadFingerprint(p, FingerprintKind::kWordLanes),
            PayloadFingerprint(p, FingerprintKind::kHalfWordLanes));
}

// The kinds restated from their definitions in contribution.h and .cc,
// one word at a time with no bulk path, over a Moments payload: its kind
// (1), count, then each vector's size and its doubles' bits.
std::vector<uint64_t> Bits(const std::vector<double>& v) {
  std::vector<uint64_t> bits(v.size());
  if (!v.empty()) std::memcpy(bits.data(), v.data(), v.size() * 8);
  return bits;
}

uint64_t SplitMix64Finalizer(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t WordLanesReference(int64_t count, const std::vector<double>& a,
                            const std::vector<double>& b) {
  std::vector<uint64_t> words = {1, static_cast<uint64_t>(count)};
  for (const std::vector<double>* v : {&a, &b}) {
    words.push_back(v->size());
    for (uint64_t w : Bits(*v)) words.push_back(w);
  }
  uint64_t lanes[4] = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL,
                       0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};
  for (size_t n = 0; n < words.size(); ++n) {
    uint64_t& lane = lanes[n % 4];
    lane = (lane ^ words[n]) * 0x9e3779b97f4a7c15ULL;
    lane ^= lane >> 29;
  }
  uint64_t h = SplitMix64Finalizer(words.size());
  for (uint64_t lane : lanes) h = SplitMix64Finalizer(h ^ lane);
  return h;
}

uint64_t HalfWordLanesReference(int64_t count, const std::vector<double>& a,
                                const std::vector<double>& b) {
  uint64_t shape = 0x243f6a8885a308d3ULL;
  auto shape_step = [&shape](uint64_t word) {
    shape = (shape ^ word) * 0x9e3779b97f4a7c15ULL;
    shape ^= shape >> 29;
  };
  uint32_t low[32], high[32];
  for (int l = 0; l < 32; ++l) {
    low[l] = static_cast<uint32_t>(
        SplitMix64Finalizer((2 * l + 1) * 0x9e3779b97f4a7c15ULL));
    high[l] = static_cast<uint32_t>(
        SplitMix64Finalizer((2 * l + 2) * 0x9e3779b97f4a7c15ULL));
  }
  auto step = [](uint32_t& chain, uint32_t half) {
    chain = (chain ^ half) * 0x9e3779b1u;
    chain ^= chain >> 15;
  };
  shape_step(1);
  shape_step(static_cast<uint64_t>(count));
  for (const std::vector<double>* v : {&a, &b}) {
    shape_step(v->size());
    const std::vector<uint64_t> words = Bits(*v);
    for (size_t i = 0; i < words.size(); ++i) {
      step(low[i % 32], static_cast<uint32_t>(words[i] & 0xffffffffu));
      step(high[i % 32], static_cast<uint32_t>(words[i] >> 32));
    }
  }
  uint64_t sum = SplitMix64Finalizer(shape);
  for (int l = 0; l < 32; ++l) {
    sum += SplitMix64Finalizer((uint64_t{high[l]} << 32) | low[l]);
  }
  return SplitMix64Finalizer(sum);
}

// Every split of the words between the two vectors, from empty to several
// bulk blocks, so that each tail length of the bulk path is met.
TEST(PayloadFingerprintTest, LaneKindsMatchTheirDefinitions) {
  for (int a = 0; a <= 140; a += 1 + a / 8) {
    for (int b = 0; b <= 140; b += 1 + b / 5) {
      std::vector<double> mean(a), m2(b);
      for (int i = 0; i < a; ++i) mean[i] = std::sin(i + 0.5) * 1e3;
      for (int i = 0; i < b; ++i) m2[i] = std::exp(0.1 * i) - 1;
      const Payload p = MomentsPayload(a + b, mean, m2);
      EXPECT_EQ(PayloadFingerprint(p, FingerprintKind::kWordLanes),
                WordLanesReference(a + b, mean, m2))
          << a << " + " << b;
      EXPECT_EQ(PayloadFingerprint(p, FingerprintKind::kHalfWordLanes),
                HalfWordLanesReference(a + b, mean, m2))
          << a << " + " << b;
    }
  }
}

class LaneKindTest : public ::testing::TestWithParam<FingerprintKind> {};

INSTANTIATE_TEST_SUITE_P(Kinds, LaneKindTest,
                         ::testing::Values(FingerprintKind::kWordLanes,
                                           FingerprintKind::kHalfWordLanes));

TEST_P(LaneKindTest, SeesEveryBitAndPosition) {
  const FingerprintKind kind = GetParam();
  auto PayloadFingerprint = [kind](const Payload& p) {
    return syncnorm::PayloadFingerprint(p, kind);
  };
  // 100 each: words in both kinds' bulk paths and around them.
  std::vector<double> mean(100), m2(100);
  for (int i = 0; i < 100; ++i) {
    mean[i] = 0.25 * i - 3;
    m2[i] = 1.0 + i;
  }
  const uint64_t base = PayloadFingerprint(MomentsPayload(8, mean, m2));
  EXPECT_EQ(base, PayloadFingerprint(MomentsPayload(8, mean, m2)));
  EXPECT_NE(base, PayloadFingerprint(MomentsPayload(9, mean, m2)));
  for (int i = 0; i < 100; ++i) {
    std::vector<double> changed = m2;
    changed[i] = std::nextafter(changed[i], 1e9);
    EXPECT_NE(base, PayloadFingerprint(MomentsPayload(8, mean, changed)))
        << "m2[" << i << "]";
  }
  // Every bit of a word in the bulk path, low half and high half.
  for (int bit = 0; bit < 64; ++bit) {
    std::vector<double> changed = m2;
    uint64_t bits;
    std::memcpy(&bits, &changed[60], sizeof(bits));
    bits ^= uint64_t{1} << bit;
    std::memcpy(&changed[60], &bits, sizeof(bits));
    EXPECT_NE(base, PayloadFingerprint(MomentsPayload(8, mean, changed)))
        << "bit " << bit;
  }
  // Two words of one lane trade places (words 3 + i in lanes of 4; word i
  // in lanes of 32).
  for (auto [i, j] : {std::pair(5, 9), std::pair(5, 37)}) {
    std::vector<double> swapped = mean;
    std::swap(swapped[i], swapped[j]);
    EXPECT_NE(base, PayloadFingerprint(MomentsPayload(8, swapped, m2)))
        << i << " <-> " << j;
  }
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
