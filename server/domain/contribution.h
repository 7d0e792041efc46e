// What a rank sends to a round and what every rank of the round gets back.
#ifndef SYNCNORM_SERVER_DOMAIN_CONTRIBUTION_H_
#define SYNCNORM_SERVER_DOMAIN_CONTRIBUTION_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"

namespace syncnorm {

// Which half of a training step a round belongs to. Values match the wire
// enum syncnorm.v1.Phase; other values are carried through and rejected by
// validation.
enum class Phase : int { kUnspecified = 0, kForward = 1, kBackward = 2 };

// "FORWARD", "BACKWARD" or "PHASE_UNSPECIFIED" (also for unknown values).
const char* PhaseName(Phase phase);

// A contribution's payload: moments for FORWARD, gradient sums for BACKWARD,
// monostate when the sender gave none.
using Payload = std::variant<std::monostate, Moments, GradSums>;

// One rank's statistics-health scores in one forward round, as a relay
// computed them (RankHealth on the wire; rank_score.h).
struct RankHealth {
  int rank = 0;
  // The forward round's step.
  int64_t step = 0;
  // The rank's batch in it, >= 1.
  int64_t count = 0;
  // In standard normal units; NaN where not scored.
  double mean_shift = std::numeric_limits<double>::quiet_NaN();
  double variance_ratio = std::numeric_limits<double>::quiet_NaN();
  // The lowest stuck channel, -1 for none.
  int stuck_channel = -1;
};

// What a relay merged into one contribution (Contribution.relay on the
// wire, docs/relay.md): an aligned block of a group's positions.
struct RelayBlock {
  int first_position = 0;  // a multiple of `positions`
  int positions = 0;       // a power of two
  // The ranks merged, ascending: the block's members at the step.
  std::vector<int> ranks;
  // Per rank of `ranks`: ContributionFingerprint of its payload and update,
  // of kFingerprintKind.
  std::vector<uint64_t> fingerprints;
  // The scores of its ranks in the layer's earlier rounds that went up as
  // blocks (RelayBlock.health).
  std::vector<RankHealth> health;
};

// One rank's share of a round, keyed by (job_id, layer, step, phase,
// backward, rank).
struct Contribution {
  std::string job_id;
  int layer = 0;
  int64_t step = 0;
  Phase phase = Phase::kUnspecified;
  int rank = 0;
  Payload payload;
  // FORWARD: this round's momentum and imported statistics, when the rank
  // sent any (Contribution.momentum, imported_stats on the wire).
  RoundUpdate update;
  // BACKWARD: which backward through the step's forward (from 0), each its
  // own round (Contribution.backward_index on the wire). 0 for FORWARD.
  int backward = 0;
  // Set when a relay sent this for a block of ranks: `rank` is the block's
  // first merged rank, `payload` and `update` the block's merge and the
  // update each of its ranks sent.
  std::optional<RelayBlock> block;
  // Set when a relay sent this: how long before it sent, the round had
  // begun at the relay (Contribution.round_age_ms). The round's grace and
  // deadline run from its earliest start. At least zero.
  absl::Duration round_age = absl::ZeroDuration();
};

// Causes of a failed round a client may act on; values match the wire's
// RoundError.Reason.
enum class RoundErrorReason : int {
  kUnspecified = 0,
  // A global count of 1 with an unbiased running var.
  kSingleValuePerChannel = 1,
  // The ranks of the group sent different updates (RoundUpdate).
  kRanksDisagree = 2,
};

// How a round ended, the same object for every contributor of the round.
// One member's contribution in a stale-synchronous answer: its rank and
// the step of the contribution used.
struct ViewEntry {
  int rank = 0;
  int64_t step = 0;
};
bool operator==(const ViewEntry& a, const ViewEntry& b);

struct RoundOutcome {
  // OK: the round completed. Otherwise why it (or the contribution) failed;
  // nothing was applied.
  absl::Status status;
  // DEADLINE_EXCEEDED: global ranks of the group that had not contributed.
  std::vector<int> missing_ranks;
  // FORWARD, OK: the group's global statistics.
  GlobalMoments moments;
  // BACKWARD, OK: the group's summed gradient sums.
  GradSums grad_sums;
  // OK: the layer's running-stats version after the round (for BACKWARD,
  // after that step's forward round).
  int64_t version = 0;
  // Not OK: the cause, when a client may act on it.
  RoundErrorReason reason = RoundErrorReason::kUnspecified;
  // OK, a job with staleness > 0: the contributions merged or summed, in
  // rank order. Empty in synchronous jobs.
  std::vector<ViewEntry> view;
  // Nonzero when this one outcome goes to many callers (a round's): unique
  // among the process's outcomes (NextOutcomeSerial), so that a transport
  // can encode it once for all of them (and for their retries).
  uint64_t serial = 0;
};

// A serial no outcome of this process had before; never 0. Thread-safe.
uint64_t NextOutcomeSerial();

// Receives a contribution's outcome; called exactly once, never under a lock
// of the aggregator.
using RoundCallback = std::function<void(const RoundOutcome&)>;

// Whether two payloads are bit-for-bit the same (a retry, not a conflict).
bool SamePayload(const Payload& a, const Payload& b);

// How a payload fingerprint was computed. Stored with every finished round
// (server/store/state.proto RoundRecord.fingerprint_kind), so that rounds
// written by an older build still tell a retry from a conflict after an
// upgrade.
enum class FingerprintKind : int {
  // Byte-wise FNV-1a: eight dependent multiplies per double. Written by
  // builds before the word-lane hash; only read back now.
  kFnv1a = 0,
  // Four independent lanes of a 64-bit multiply-xorshift over the raw words,
  // folded by a 64-bit finalizer: about two cycles per double, bound by
  // the multiply. Written by builds before kHalfWordLanes.
  kWordLanes = 1,
  // 32 lanes, each two 32-bit multiply-xorshift chains that take the low
  // and the high half of the lane's words, folded 64 bits per lane: vector
  // multiplies, eight to an AVX2 instruction.
  kHalfWordLanes = 2,
};

// The kind this build computes for new rounds, and the newest it reads.
inline constexpr FingerprintKind kFingerprintKind =
    FingerprintKind::kHalfWordLanes;

// A 64-bit hash of a payload's exact bits (its kind, count, sizes and every
// double; -0.0 differs from 0.0), kept for finished rounds to tell a retry
// from a conflicting resend. Computed by the contributing thread when its
// payload joins a round, never by the thread that completes the round.
uint64_t PayloadFingerprint(const Payload& payload,
                            FingerprintKind kind = kFingerprintKind);

// The fingerprint of a payload with its round update: PayloadFingerprint's
// when the update is empty (so rounds stored before updates existed keep
// theirs), else that mixed with every bit of the update.
uint64_t ContributionFingerprint(const Payload& payload,
                                 const RoundUpdate& update,
                                 FingerprintKind kind = kFingerprintKind);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_CONTRIBUTION_H_
