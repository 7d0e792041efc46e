#include "server/domain/contribution.h"

#include <atomic>
#include <cstddef>
#include <cstring>

namespace syncnorm {

bool operator==(const ViewEntry& a, const ViewEntry& b) {
  return a.rank == b.rank && a.step == b.step;
}

uint64_t NextOutcomeSerial() {
  static std::atomic<uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
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

// The splitmix64 finalizer: a bijection of 64-bit words.
constexpr uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

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
  uint64_t lane_[kLanes] = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL,
                            0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};
  uint64_t n_ = 0;  // words added
};

// FingerprintKind::kHalfWordLanes. The words that say what a payload is
// (its kind, count, and each vector's size) step one 64-bit chain, as a
// kWordLanes lane does. The doubles go to 32 lanes, word i of each vector
// to lane i mod 32, so every vector's bulk starts at lane 0: its low half
// steps the lane's low 32-bit chain and its high half the high chain, each
// by HalfStep, a bijection of the chain for a fixed half and of the half
// for a fixed chain. So payloads that differ in one word always differ in
// one lane's 64 bits (high chain, low chain) or in the shape chain. The
// value is Mix(Mix(shape) + the sum of Mix(lane) over the lanes): a change
// of one term changes the sum, hence the value; the 33 Mix calls are
// independent, so the CPU overlaps them. Chain c (lane l: low 2l, high
// 2l + 1) starts at the low 32 bits of Mix((c + 1) * 0x9e3779b97f4a7c15),
// the shape chain at 0x243f6a8885a308d3.
constexpr int kHalfLanes = 32;
constexpr uint32_t kHalfOdd = 0x9e3779b1u;
constexpr int kHalfShift = 15;
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "HalfWordBlocks reads a word's low half first");

uint32_t HalfStep(uint32_t chain, uint32_t half) {
  chain = (chain ^ half) * kHalfOdd;
  return chain ^ (chain >> kHalfShift);
}

struct HalfChains {
  uint32_t c[2 * kHalfLanes];
};

constexpr HalfChains HalfChainStarts() {
  HalfChains starts{};
  for (int c = 0; c < 2 * kHalfLanes; ++c) {
    starts.c[c] = static_cast<uint32_t>(
        Mix((static_cast<uint64_t>(c) + 1) * 0x9e3779b97f4a7c15ULL));
  }
  return starts;
}

// `blocks` blocks of kHalfLanes words into the chains, exactly as HalfStep
// one word at a time, eight chains to a vector: the low and high chains of
// four lanes take the four words' halves as they lie in memory. Compiled
// twice, below: for any CPU, and for x86-64 with AVX2.
using HalfVector = uint32_t __attribute__((vector_size(32)));

inline __attribute__((always_inline)) void HalfWordBlocksBody(
    uint32_t* chains, const double* words, size_t blocks) {
  constexpr int kVectors = 2 * kHalfLanes / 8;
  HalfVector lanes[kVectors];
  std::memcpy(lanes, chains, sizeof(lanes));
  for (size_t b = 0; b < blocks; ++b, words += kHalfLanes) {
    for (int v = 0; v < kVectors; ++v) {
      HalfVector in;
      std::memcpy(&in, words + 4 * v, sizeof(in));
      HalfVector x = (lanes[v] ^ in) * kHalfOdd;
      lanes[v] = x ^ (x >> kHalfShift);
    }
  }
  std::memcpy(chains, lanes, sizeof(lanes));
}

void HalfWordBlocksPortable(uint32_t* chains, const double* words,
                            size_t blocks) {
  HalfWordBlocksBody(chains, words, blocks);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void HalfWordBlocksAvx2(uint32_t* chains,
                                                        const double* words,
                                                        size_t blocks) {
  HalfWordBlocksBody(chains, words, blocks);
}

// Chosen by a test of the CPU on first use, not by an ifunc: a resolver
// runs before ThreadSanitizer's runtime is up.
void HalfWordBlocks(uint32_t* chains, const double* words, size_t blocks) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    HalfWordBlocksAvx2(chains, words, blocks);
  } else {
    HalfWordBlocksPortable(chains, words, blocks);
  }
}
#else
void HalfWordBlocks(uint32_t* chains, const double* words, size_t blocks) {
  HalfWordBlocksPortable(chains, words, blocks);
}
#endif

class HalfWordLaneHasher {
 public:
  void Add(uint64_t word) {
    shape_ = (shape_ ^ word) * 0x9e3779b97f4a7c15ULL;
    shape_ ^= shape_ >> 29;
  }
  void Add(const std::vector<double>& v) {
    Add(static_cast<uint64_t>(v.size()));
    const size_t blocks = v.size() / kHalfLanes;
    HalfWordBlocks(chains_.c, v.data(), blocks);
    for (size_t i = blocks * kHalfLanes; i < v.size(); ++i) {
      uint64_t word;
      std::memcpy(&word, &v[i], sizeof(word));
      const size_t lane = i % kHalfLanes;
      chains_.c[2 * lane] =
          HalfStep(chains_.c[2 * lane], static_cast<uint32_t>(word));
      chains_.c[2 * lane + 1] =
          HalfStep(chains_.c[2 * lane + 1], static_cast<uint32_t>(word >> 32));
    }
  }
  uint64_t value() const {
    uint64_t sum = Mix(shape_);
    for (int l = 0; l < kHalfLanes; ++l) {
      sum += Mix(uint64_t{chains_.c[2 * l + 1]} << 32 | chains_.c[2 * l]);
    }
    return Mix(sum);
  }

 private:
  static constexpr HalfChains kStarts = HalfChainStarts();

  uint64_t shape_ = 0x243f6a8885a308d3ULL;
  HalfChains chains_ = kStarts;
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
  switch (kind) {
    case FingerprintKind::kFnv1a:
      return Fingerprint<Fnv1aHasher>(payload);
    case FingerprintKind::kWordLanes:
      return Fingerprint<WordLaneHasher>(payload);
    case FingerprintKind::kHalfWordLanes:
      break;
  }
  return Fingerprint<HalfWordLaneHasher>(payload);
}

uint64_t ContributionFingerprint(const Payload& payload,
                                 const RoundUpdate& update,
                                 FingerprintKind kind) {
  const uint64_t fingerprint = PayloadFingerprint(payload, kind);
  if (update.empty()) return fingerprint;
  uint64_t u = 0;
  switch (kind) {
    case FingerprintKind::kFnv1a:
      u = UpdateFingerprint<Fnv1aHasher>(update);
      break;
    case FingerprintKind::kWordLanes:
      u = UpdateFingerprint<WordLaneHasher>(update);
      break;
    case FingerprintKind::kHalfWordLanes:
      u = UpdateFingerprint<HalfWordLaneHasher>(update);
      break;
  }
  // Order matters (payload, then update); the odd multiplier keeps the two
  // from cancelling.
  return (fingerprint ^ 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL ^ u;
}

}  // namespace syncnorm
