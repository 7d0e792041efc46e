// The outcomes of the newest finished rounds of one (group, layer, phase),
// kept so that a retry after a round finished gets the same answer.
#ifndef SYNCNORM_SERVER_DOMAIN_RECENT_ROUNDS_H_
#define SYNCNORM_SERVER_DOMAIN_RECENT_ROUNDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/moments.h"
#include "server/domain/contribution.h"

namespace syncnorm {

// A bounded window of finished rounds (completed or failed), the latest
// finished kept: for FORWARD rounds, which finish in step order, the newest
// steps; BACKWARD rounds may finish in any order. Not thread-safe: its
// owner's mutex guards it.
class RecentRounds {
 public:
  struct Entry {
    int64_t step = 0;
    std::shared_ptr<const RoundOutcome> outcome;
    // Per rank of the group: the fingerprint of what it sent, or nullopt
    // when it had not contributed (a failed round).
    std::vector<std::optional<uint64_t>> fingerprints;
    // An OK FORWARD round: the layer's running statistics right after it
    // (what a checkpoint of this step holds). Null otherwise.
    std::shared_ptr<const RunningStats> stats_after;
    // How `fingerprints` were computed: kFingerprintKind, or an older kind
    // for rounds loaded from a data dir written by an older build.
    FingerprintKind fingerprint_kind = kFingerprintKind;
    // BACKWARD: which backward through the step's forward (Contribution).
    int backward = 0;
  };

  // Keeps at most `capacity` entries. REQUIRES: capacity > 0.
  explicit RecentRounds(int capacity) : capacity_(capacity) {}

  // Adds `entry`; when over capacity, drops the entry added first.
  // REQUIRES: no entry for (entry.step, entry.backward) yet.
  void Add(Entry entry);

  // The entry for (`step`, `backward`), or nullptr when not (or no longer)
  // kept.
  const Entry* Find(int64_t step, int backward) const;

  // Every kept entry, in no particular order.
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  size_t capacity_;
  std::vector<Entry> entries_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_RECENT_ROUNDS_H_
