// The aggregator's durable state behind an interface: job specs, each
// layer's latest running statistics with its version and last applied step,
// the completed rounds that retries may still ask about, and immutable
// checkpoints.
#ifndef SYNCNORM_SERVER_STORE_STATE_STORE_H_
#define SYNCNORM_SERVER_STORE_STATE_STORE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"
#include "server/domain/job_spec.h"
#include "server/domain/membership.h"

namespace syncnorm {

// What survives a restart of one (job, group, layer).
struct LayerState {
  RunningStats stats;
  // Step of the last applied forward round; -1 before any.
  int64_t last_applied = -1;
  // Highest step that completed OK, indexed FORWARD = 0, BACKWARD = 1; -1
  // before any. FORWARD contributions at or below it are superseded, and
  // BACKWARD ones above the FORWARD's come before their forward round.
  std::array<int64_t, 2> latest_completed = {-1, -1};
  // The layer runs no rounds (freeze, use_global_stats), as its last
  // SetRunningStats said: the committed step does not wait for it. A
  // forward round of it that completes clears this.
  bool frozen = false;
};

// Which round of a (group, layer, phase) a stored round is: its step and,
// BACKWARD, which backward through the step's forward.
struct RoundId {
  int64_t step = 0;
  int backward = 0;
};
inline bool operator==(const RoundId& a, const RoundId& b) {
  return a.step == b.step && a.backward == b.backward;
}

// A completed (OK) round, kept so that a retry gets the identical answer.
struct StoredRound {
  Phase phase = Phase::kForward;
  int64_t step = 0;
  // BACKWARD: which backward through the step's forward (Contribution).
  int backward = 0;
  RoundOutcome outcome;
  // Per rank of the group: the fingerprint of its payload (see Round),
  // computed as fingerprint_kind says.
  std::vector<std::optional<uint64_t>> fingerprints;
  FingerprintKind fingerprint_kind = kFingerprintKind;
  // FORWARD: the layer's running statistics right after the round.
  std::optional<RunningStats> stats_after;
};

// One (group, layer) of a job with its state.
struct LayerSlot {
  int group = 0;
  int layer = 0;
  LayerState state;
};

// A stored (group, layer) with the rounds kept for it, oldest step first.
struct StoredLayer {
  LayerSlot slot;
  std::vector<StoredRound> rounds;
};

struct CheckpointMeta {
  std::string job_id;
  int64_t step = 0;
  std::string tag;  // empty: untagged (subject to retention)
  int64_t created_unix_ms = 0;
  // The members in force after `step` when it was cut, and their version;
  // absent in checkpoints written before membership existed (a restore
  // then keeps every rank of the job's initial members).
  std::optional<std::vector<int>> members;
  int64_t membership_version = 0;
};

// An immutable snapshot of every (group, layer) of a job at one step.
struct CheckpointData {
  CheckpointMeta meta;
  std::vector<LayerSlot> layers;
};

// Identifies one stale-synchronous answer of a job.
struct StaleKey {
  int group = 0;
  int layer = 0;
  Phase phase = Phase::kForward;
  int64_t step = 0;
  int rank = 0;
};

// The answer to one rank's contribution in a job with staleness > 0, kept
// so that a retry gets it again and so that, after a restart, the
// contribution still counts (in the views of later answers, and in its
// step's merge of the running statistics).
struct StoredStaleAnswer {
  StaleKey key;
  // What the rank sent: Moments (FORWARD) or GradSums (BACKWARD).
  Payload payload;
  // ContributionFingerprint of the payload (no round update: a stale job
  // takes none), computed as fingerprint_kind says.
  uint64_t fingerprint = 0;
  FingerprintKind fingerprint_kind = kFingerprintKind;
  // OK: moments or grad_sums, version and view.
  RoundOutcome outcome;
};

// A job as found at startup.
struct StoredJob {
  JobSpec spec;                     // resolved
  std::vector<StoredLayer> layers;  // only (group, layer)s written so far
  std::vector<CheckpointMeta> checkpoints;  // by step
  // The job's membership changes, oldest first; empty: never changed
  // (the spec's initial members).
  std::vector<MembershipChange> membership;
  // Its stale-synchronous answers (staleness > 0), by layer, group, phase,
  // step and rank.
  std::vector<StoredStaleAnswer> stale;
};

// Everything the store holds of one job: what a backup carries.
struct JobImage {
  StoredJob job;
  // Every checkpoint of job.checkpoints, in the same order.
  std::vector<CheckpointData> checkpoints;
};

// Durable state. Each method is atomic: all of its writes land or none.
// A returned OK means the writes are in the write-ahead log (fsynced when
// the store syncs writes). Errors: UNAVAILABLE / RESOURCE_EXHAUSTED (disk
// full) / INTERNAL for a failed write, DATA_LOSS for a record that cannot
// be decoded, NOT_FOUND for a missing checkpoint; messages name the store's
// location and the key. Thread-safe.
class StateStore {
 public:
  virtual ~StateStore() = default;

  // Where the state lives, for messages ("data_dir /var/lib/x", "memory").
  virtual std::string Describe() const = 0;

  // Every job with its stored layers and checkpoint list; DATA_LOSS naming
  // the first record that is corrupt or does not fit its job's spec.
  virtual absl::StatusOr<std::vector<StoredJob>> LoadAll() = 0;

  // Stores a job's (resolved) spec.
  virtual absl::Status PutJob(const JobSpec& spec) = 0;

  // Removes every record of the job; OK if there are none.
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;

  // One completed round of (job, slot.group, slot.layer): the layer's new
  // state, the round's outcome, and the removal of the same phase's rounds
  // `evicted` (fallen out of the retry window).
  virtual absl::Status CommitRound(const std::string& job_id,
                                   const LayerSlot& slot,
                                   const StoredRound& round,
                                   absl::Span<const RoundId> evicted) = 0;

  // Replaces the state of the given (group, layer)s; with `drop_rounds`,
  // also forgets every stored round of the job (a restore), and with
  // `membership` (not null) replaces the job's membership changes.
  virtual absl::Status PutLayers(
      const std::string& job_id, absl::Span<const LayerSlot> layers,
      bool drop_rounds,
      const std::vector<MembershipChange>* membership = nullptr) = 0;

  // Stores one stale-synchronous answer and removes those at `evicted`
  // (fallen out of what the job keeps).
  virtual absl::Status PutStaleAnswer(const std::string& job_id,
                                      const StoredStaleAnswer& answer,
                                      absl::Span<const StaleKey> evicted) = 0;

  // Replaces the job's membership changes (StoredJob::membership).
  virtual absl::Status PutMembership(
      const std::string& job_id,
      const std::vector<MembershipChange>& membership) = 0;

  // Stores a checkpoint and deletes the job's checkpoints at `drop_steps`.
  virtual absl::Status PutCheckpoint(const CheckpointData& checkpoint,
                                     absl::Span<const int64_t> drop_steps) = 0;

  // A stored checkpoint; NOT_FOUND if there is none at `step`.
  virtual absl::StatusOr<CheckpointData> GetCheckpoint(
      const std::string& job_id, int64_t step) = 0;

  // Replaces every record of image.job.spec.job_id (there may be none) by
  // the image's: spec, layers with their rounds, checkpoints.
  virtual absl::Status PutJobImage(const JobImage& image) = 0;

  // Writes a copy of the whole store, as of one moment, to the new folder
  // `dir`, which then opens as a data_dir (a backup). FAILED_PRECONDITION
  // for a store in memory; otherwise the write's error, `dir` incomplete.
  virtual absl::Status CopyTo(const std::string& dir) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_STATE_STORE_H_
