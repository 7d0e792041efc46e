// The relay's rounds (docs/relay.md): each rank's contribution is held in
// its block round until every member of the block has sent, then the
// block goes to the layer's shard as one merged contribution, or each
// contribution goes through unmerged when merging would not be exact.
#ifndef SYNCNORM_RELAY_RELAY_H_
#define SYNCNORM_RELAY_RELAY_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "relay/answers.h"
#include "relay/block_health.h"
#include "relay/block_round.h"
#include "relay/job_view.h"
#include "relay/relay_options.h"
#include "relay/timer_queue.h"
#include "relay/upstream.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Why a contribution went through unmerged.
enum class PassReason {
  kUnknownJob,      // the job could not be read (GetJob failed)
  kNotMergeable,    // the shard takes no blocks, a stale-synchronous job, a
                    // rank outside its block's members, a block of one
  kLate,            // its block round was already answered or released
  kResend,          // a resend that differs, or one after the block went up
  kIncomplete,      // its block was incomplete at the grace or timeout
  kMembersChanged,  // its block's members changed when the job was reread
  kUnmergeable,     // the block's payloads or updates do not merge
  kRefusedByShard,  // the shard refused the block (ABORTED, ...)
};
inline constexpr int kPassReasons = 8;
// "unknown_job", "not_mergeable", ...: the metrics' reason label.
const char* PassReasonName(PassReason reason);

// What the relay did, since it started, and what it holds now.
struct RelayCounters {
  // Merged blocks sent to a shard.
  int64_t blocks_forwarded = 0;
  // Contributions sent through unmerged, in all and by PassReason.
  int64_t passed_through = 0;
  // Statistics health: ranks of merged blocks scored, and their scores
  // sent up with a block (BlockHealth).
  int64_t ranks_scored = 0;
  int64_t health_sent = 0;
  std::array<int64_t, kPassReasons> passed_through_by{};
  // Block rounds held now, and (job, shard) pairs known.
  int64_t open_blocks = 0;
  int64_t jobs = 0;
};

// Thread-safe. Answers go out on gRPC's or the timer queue's threads, or
// inline in Contribute for a refusal; never under the relay's lock.
class Relay {
 public:
  // `upstream` and `timers` outlive the relay, and the timer queue stops
  // before it goes. REQUIRES: options valid (RelayServer checks them).
  Relay(const RelayOptions& options, Upstream& upstream, TimerQueue& timers);

  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Takes one rank's contribution; `done` gets its answer exactly once:
  // the shard's result, the shard's failure in-band (RoundResult.error),
  // RESOURCE_EXHAUSTED past the relay's bounds. `c` may be a child relay's
  // block (c.relay): a relay of relays merges it into its own block when
  // it fits (docs/relay.md), and sends it on as it came otherwise.
  void Contribute(v1::Contribution c, AnswerFn done) ABSL_LOCKS_EXCLUDED(mu_);

  RelayCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A job as one shard serves it: a sharded job's shards each say which
  // steps they have completed.
  using JobKey = std::pair<std::string, int>;  // (job_id, shard)
  // (job, shard, layer, step, phase, backward index, group, block).
  using BlockKey =
      std::tuple<std::string, int, int, int64_t, int, int, int, int>;
  // A block's round: (job, shard, layer, step, phase, backward index).
  using RoundKey = std::tuple<std::string, int, int, int64_t, int, int>;
  struct RoundStart {
    // The round's first arrival at this relay, or earlier: a child relay's
    // round_age_ms moves it back.
    absl::Time first;
    int open_blocks = 0;  // its block rounds held
  };
  using Actions = std::vector<std::function<void()>>;

  struct Pending {
    v1::Contribution contribution;
    AnswerFn done;
  };
  struct JobEntry {
    std::optional<JobView> view;
    bool fetching = false;
    // The highest step a GetJob was read for after it arrived: a rank the
    // view does not count rereads the job once per step.
    int64_t fresh_step = -1;
    // Contributions waiting for the fetch.
    std::vector<Pending> waiting;
    int open_blocks = 0;
    // The last contribution's arrival: at --max_jobs, the job idle the
    // longest makes room.
    absl::Time last_used;
  };

  // Room for one more job: false when all --max_jobs hold rounds.
  bool MakeRoomForAJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Place(const JobKey& jk, JobEntry& job, Pending p, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block round of `key`, opened with `positions` and `members` if
  // there is none; null when `p` was answered instead (the round was
  // already answered: it went through; past the job's cap: refused).
  BlockRound* FindOrOpen(const BlockKey& key, JobEntry& job,
                         std::vector<int> positions, std::vector<int> members,
                         Pending& p, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PassThrough of one contribution with its one waiter.
  void PassOne(int shard, Pending p, absl::Time deadline, PassReason why,
               Actions& actions, absl::Time started = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the round of the block `key` (held) began here: its first
  // arrival, moved back by what child relays said (Backdate).
  absl::Time RoundFirst(const BlockKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A child relay's contribution `c` to the block `key` (held) says the
  // round began there round_age_ms before it sent: the round's start here
  // moves back to that, and its blocks' pass-through times with it.
  void Backdate(const BlockKey& key, const v1::Contribution& c,
                const JobView& view, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block's members at the round's step, by position, and the ranks
  // of its positions.
  void BlockRanks(const JobView& view, int group, int block, int64_t step,
                  std::vector<int>& positions, std::vector<int>& members) const;
  void Complete(const BlockKey& key, BlockRound& round, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends every contribution the block holds through, each to its own
  // waiters, and forgets the block.
  void Release(const BlockKey& key, PassReason why, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `c` up for `waiters`; with `started` (the round's start here),
  // saying how long the round has been open (Contribution.round_age_ms).
  void PassThrough(int shard, v1::Contribution c, std::vector<AnswerFn> waiters,
                   absl::Time deadline, PassReason why, Actions& actions,
                   absl::Time started = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fetch(const JobKey& jk, JobEntry& job, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fetched(const JobKey& jk, absl::StatusOr<v1::JobInfo> info)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases the job's blocks whose members the new view changed.
  void Recheck(const JobKey& jk, const JobView& view, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Check(const BlockKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  void ScheduleCheck(const BlockKey& key, absl::Time when);
  void BlockAnswered(const BlockKey& key, const grpc::Status& status,
                     v1::RoundResult result) ABSL_LOCKS_EXCLUDED(mu_);
  // When an incomplete block goes through: the quorum's grace or the round
  // timeout, less the margin, from its first arrival.
  absl::Time PassAt(const JobView& view, absl::Time first) const;
  // How long to resend to a shard: the job's round timeout from `first`.
  absl::Time RetryDeadline(const JobView* view, absl::Time first) const;

  // Constant after construction.
  const RelayOptions options_;
  Upstream& upstream_;
  TimerQueue& timers_;
  // Thread-safe itself; taken under mu_ or without it.
  BlockHealth health_;

  mutable absl::Mutex mu_;
  std::map<JobKey, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<BlockKey, std::unique_ptr<BlockRound>> blocks_ ABSL_GUARDED_BY(mu_);
  // The rounds of the blocks held. An incomplete block goes through at
  // its round's first arrival (not its own) plus the grace or timeout:
  // the shard's deadline runs from the round's first contribution.
  std::map<RoundKey, RoundStart> round_starts_ ABSL_GUARDED_BY(mu_);
  // Block rounds answered or released, most recent last, so that a late
  // rank or a retry goes through: at most kRememberedBlocks.
  std::map<BlockKey, int64_t> done_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, BlockKey> done_order_ ABSL_GUARDED_BY(mu_);
  int64_t done_serial_ ABSL_GUARDED_BY(mu_) = 0;
  RelayCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_H_
