#include "server/domain/contribution.h"

#include <cstring>

namespace syncnorm {

bool operator==(const ViewEntry& a, const ViewEntry& b) {
  return a.rank == b.rank && a.step == b.step;
}

namespace {

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// The words a fingerprint covers, in order: payload kind, count (moments),
// then each vector's size followed by its doubles' bits.
template <typename Hasher>
uint64_t Fingerprint(const Payload& payload) {
  Hasher h;
  h.Add(static_cast<uint64_t>(payload.index()));
  if (const auto* m = std::get_if<Moments>(&payload)) {
    h.Add(static_cast<uint64_t>(m->count));
    h.Add(m->mean);
    h.Add(m->m2);
  } else if (const auto* g = std::get_if<GradSums>(&payload)) {
    h.Add(g->sum_dy);
    h.Add(g->sum_dy_xmu);
  }
  return h.value();
}

// FingerprintKind::kFnv1a: FNV-1a over the bytes of each 64-bit word.
class Fnv1aHasher {
 public:
  void Add(uint64_t word) {
    for (int i = 0; i < 8; ++i) {
      h_ ^= (word >> (8 * i)) & 0xff;
      h_ *= 0x100000001b3ULL;
    }
  }
  void Add(const std::vector<double>& v) {
    Add(static_cast<uint64_t>(v.size()));
    for (double d : v) {
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      Add(bits);
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

// FingerprintKind::kWordLanes. Word i goes to lane i mod 4 by a step that is
// a bijection of the lane's state for a fixed word and of the word for a
// fixed state, so payloads that differ in one word always differ in that
// lane; the lanes' chains are independent, so the CPU overlaps them.
class WordLaneHasher {
 public:
  void Add(uint64_t word) {
    Step(lane_[n_ % kLanes], word);
    ++n_;
  }
  void Add(const std::vector<double>& v) {
    Add(static_cast<uint64_t>(v.size()));
    const size_t size = v.size();
    size_t i = 0;
    // Lane-aligned bulk: four words per iteration, one per lane.
    for (; i < size && n_ % kLanes != 0; ++i) Add(Bits(v[i]));
    for (; i + kLanes <= size; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) Step(lane_[l], Bits(v[i + l]));
      n_ += kLanes;
    }
    for (; i < size; ++i) Add(Bits(v[i]));
  }
  uint64_t value() const {
    uint64_t h = Mix(n_);
    for (uint64_t lane : lane_) h = Mix(h ^ lane);
    return h;
  }

 private:
  static constexpr int kLanes = 4;
  static constexpr uint64_t kOdd = 0x9e3779b97f4a7c15ULL;

  static uint64_t Bits(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    return bits;
  }
  static void Step(uint64_t& lane, uint64_t word) {
    lane = (lane ^ word) * kOdd;
    lane ^= lane >> 29;
  }
  // The splitmix64 finalizer.
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  uint64_t lane_[kLanes] = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL,
                            0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};
  uint64_t n_ = 0;  // words added
};

// The words of an update, in order: whether each part is there, then the
// momentum's mode and bits, the import's counter and values.
template <typename Hasher>
uint64_t UpdateFingerprint(const RoundUpdate& update) {
  Hasher h;
  h.Add(update.momentum.has_value() ? 1 : 0);
  if (update.momentum.has_value()) {
    h.Add(static_cast<uint64_t>(update.momentum->mode));
    h.Add(std::vector<double>{update.momentum->momentum});
  }
  h.Add(update.imported.has_value() ? 1 : 0);
  if (update.imported.has_value()) {
    h.Add(static_cast<uint64_t>(update.imported->num_batches_tracked));
    h.Add(update.imported->mean);
    h.Add(update.imported->var);
  }
  return h.value();
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "FORWARD";
    case Phase::kBackward:
      return "BACKWARD";
    default:
      return "PHASE_UNSPECIFIED";
  }
}

bool SamePayload(const Payload& a, const Payload& b) {
  if (a.index() != b.index()) return false;
  if (const auto* ma = std::get_if<Moments>(&a)) {
    const auto& mb = std::get<Moments>(b);
    return ma->count == mb.count && SameBits(ma->mean, mb.mean) &&
           SameBits(ma->m2, mb.m2);
  }
  if (const auto* ga = std::get_if<GradSums>(&a)) {
    const auto& gb = std::get<GradSums>(b);
    return SameBits(ga->sum_dy, gb.sum_dy) &&
           SameBits(ga->sum_dy_xmu, gb.sum_dy_xmu);
  }
  return true;
}

uint64_t PayloadFingerprint(const Payload& payload, FingerprintKind kind) {
  return kind == FingerprintKind::kFnv1a ? Fingerprint<Fnv1aHasher>(payload)
                                         : Fingerprint<WordLaneHasher>(payload);
}

uint64_t ContributionFingerprint(const Payload& payload,
                                 const RoundUpdate& update,
                                 FingerprintKind kind) {
  const uint64_t fingerprint = PayloadFingerprint(payload, kind);
  if (update.empty()) return fingerprint;
  const uint64_t u = kind == FingerprintKind::kFnv1a
                         ? UpdateFingerprint<Fnv1aHasher>(update)
                         : UpdateFingerprint<WordLaneHasher>(update);
  // Order matters (payload, then update); the odd multiplier keeps the two
  // from cancelling.
  return (fingerprint ^ 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL ^ u;
}

}  // namespace syncnorm
