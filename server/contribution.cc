#include "server/contribution.h"

#include <cstring>

namespace syncnorm {
namespace {

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// FNV-1a over 64-bit words; the exact bits matter, so -0.0 != 0.0.
class Hasher {
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

uint64_t PayloadFingerprint(const Payload& payload) {
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

}  // namespace syncnorm
