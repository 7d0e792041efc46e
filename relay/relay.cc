#include "relay/relay.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shard_router.h"

namespace syncnorm {
namespace {

// Finished block rounds remembered, so that a late rank or a retry of one
// goes through at once instead of opening the round again. A forgotten
// one opens a block round that cannot complete and goes through at its
// job's pass-through time: later, never wrong.
constexpr int64_t kRememberedBlocks = 1 << 16;

// How long to resend to a shard that is unreachable when the job's round
// timeout is not known (the job could not be read).
constexpr absl::Duration kUnknownJobRetry = absl::Seconds(30);

// A block of a layer, whatever its round (statistics health).
template <typename BlockKey>
BlockHealth::BlockId HealthIdOf(const BlockKey& k) {
  return BlockHealth::BlockId(std::get<0>(k), std::get<1>(k), std::get<2>(k),
                              std::get<6>(k), std::get<7>(k));
}

template <typename BlockKey>
auto RoundKeyOf(const BlockKey& k) {
  return std::make_tuple(std::get<0>(k), std::get<1>(k), std::get<2>(k),
                         std::get<3>(k), std::get<4>(k), std::get<5>(k));
}

void Run(std::vector<std::function<void()>>& actions) {
  for (auto& action : actions) action();
  actions.clear();
}

// Delivers one answer to every waiter.
void AnswerAll(const std::vector<AnswerFn>& waiters, const RoundAnswer& a) {
  for (const AnswerFn& done : waiters) done(a);
}

}  // namespace

const char* PassReasonName(PassReason reason) {
  switch (reason) {
    case PassReason::kUnknownJob:
      return "unknown_job";
    case PassReason::kNotMergeable:
      return "not_mergeable";
    case PassReason::kLate:
      return "late";
    case PassReason::kResend:
      return "resend";
    case PassReason::kIncomplete:
      return "incomplete";
    case PassReason::kMembersChanged:
      return "members_changed";
    case PassReason::kUnmergeable:
      return "unmergeable";
    case PassReason::kRefusedByShard:
      return "refused_by_shard";
  }
  return "unknown";
}

Relay::Relay(const RelayOptions& options, Upstream& upstream,
             TimerQueue& timers)
    : options_(options), upstream_(upstream), timers_(timers) {}

RelayCounters Relay::counters() const {
  RelayCounters c;
  {
    absl::MutexLock lock(&mu_);
    c = counters_;
    c.open_blocks = static_cast<int64_t>(blocks_.size());
    c.jobs = static_cast<int64_t>(jobs_.size());
  }
  c.ranks_scored = health_.ranks_scored();
  c.health_sent = health_.entries_sent();
  return c;
}

void Relay::Contribute(v1::Contribution c, AnswerFn done) {
  const int shard = ShardOf(c.job_id(), c.layer(), upstream_.num_shards());
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    JobKey jk(c.job_id(), shard);
    auto it = jobs_.find(jk);
    if (it == jobs_.end()) {
      if (!MakeRoomForAJob()) {
        actions.push_back([c = std::move(c), done = std::move(done),
                           max = options_.max_jobs] {
          done(ErrorAnswer(
              c, absl::ResourceExhaustedError(absl::StrCat(
                     "the relay holds rounds of ", max,
                     " (job, shard) pairs, its --max_jobs; send this job's "
                     "rounds to another relay or to the aggregator"))));
        });
      } else {
        it = jobs_.emplace(jk, JobEntry()).first;
      }
    }
    if (it != jobs_.end()) {
      JobEntry& job = it->second;
      job.last_used = absl::Now();
      const int64_t step = c.step();
      const bool member =
          job.view.has_value() && job.view->IsMember(c.rank(), step);
      // Read the job when unknown, or for a rank the view does not count
      // (a join it has not seen); once per step. A new step alone is no
      // reason: rereading at every step put a GetJob on every step's
      // critical path, for membership changes that are rare. A change the
      // view missed costs at most --job_refresh_ms: the block waiting for
      // a rank that left rereads the job then (Check), and a block that
      // merged a rank no longer a member is refused by the shard and goes
      // through.
      const bool stale =
          !job.view.has_value() || (step > job.fresh_step && !member);
      Pending p{std::move(c), std::move(done)};
      // A fresh view serves while a reread (a waiting block's) is under
      // way: only a contribution the view cannot judge waits for it.
      if (stale) {
        job.waiting.push_back(std::move(p));
        if (!job.fetching) Fetch(jk, job, actions);
      } else {
        Place(jk, job, std::move(p), actions);
      }
    }
  }
  Run(actions);
}

bool Relay::MakeRoomForAJob() {
  if (jobs_.size() < static_cast<size_t>(options_.max_jobs)) return true;
  // Only when full: O(max_jobs).
  auto idlest = jobs_.end();
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    const JobEntry& j = it->second;
    if (j.open_blocks > 0 || j.fetching || !j.waiting.empty()) continue;
    if (idlest == jobs_.end() || j.last_used < idlest->second.last_used) {
      idlest = it;
    }
  }
  if (idlest == jobs_.end()) return false;
  jobs_.erase(idlest);
  return true;
}

void Relay::Fetch(const JobKey& jk, JobEntry& job, Actions& actions) {
  job.fetching = true;
  actions.push_back([this, jk] {
    upstream_.GetJob(jk.second, jk.first,
                     [this, jk](absl::StatusOr<v1::JobInfo> info) {
                       Fetched(jk, std::move(info));
                     });
  });
}

void Relay::Fetched(const JobKey& jk, absl::StatusOr<v1::JobInfo> info) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(jk);
    if (it == jobs_.end()) return;
    JobEntry& job = it->second;
    job.fetching = false;
    std::vector<Pending> waiting = std::move(job.waiting);
    job.waiting.clear();
    absl::StatusOr<JobView> view =
        info.ok() ? JobView::FromProto(*info) : info.status();
    if (view.ok()) {
      job.view = *std::move(view);
      for (const Pending& p : waiting) {
        job.fresh_step = std::max(job.fresh_step, p.contribution.step());
      }
      Recheck(jk, *job.view, actions);
    }
    for (Pending& p : waiting) {
      if (job.view.has_value()) {
        Place(jk, job, std::move(p), actions);
      } else {
        // The shard answers for a job the relay cannot read.
        PassOne(jk.second, std::move(p), RetryDeadline(nullptr, absl::Now()),
                PassReason::kUnknownJob, actions);
      }
    }
    if (!job.view.has_value() && job.open_blocks == 0 && job.waiting.empty()) {
      jobs_.erase(it);  // nothing to keep of an unknown job
    }
  }
  Run(actions);
}

void Relay::BlockRanks(const JobView& view, int group, int block, int64_t step,
                       std::vector<int>& positions,
                       std::vector<int>& members) const {
  const int b = options_.block_positions;
  positions = view.PositionRanks(group, block * b, b);
  members.clear();
  for (int r : positions) {
    if (view.IsMember(r, step)) members.push_back(r);
  }
}

void Relay::Place(const JobKey& jk, JobEntry& job, Pending p,
                  Actions& actions) {
  const JobView& view = *job.view;
  const v1::Contribution& c = p.contribution;
  const absl::Time now = absl::Now();
  std::optional<RankPlace> place =
      view.Place(c.rank(), options_.block_positions);
  std::vector<int> positions;
  std::vector<int> members;
  if (place.has_value()) {
    BlockRanks(view, place->group, place->block, c.step(), positions, members);
  }
  // A child relay's block merges here when it is a smaller aligned block
  // inside this relay's (BlockRound::Add checks the rest); otherwise it
  // goes up as it came, for the shard (or a parent relay) to take.
  const bool fits =
      !c.has_relay() ||
      (place.has_value() && c.relay().positions() > 0 &&
       c.relay().positions() < options_.block_positions &&
       c.relay().first_position() / options_.block_positions == place->block);
  const bool mergeable =
      view.accepts_relay_blocks() && view.staleness() == 0 &&
      place.has_value() && members.size() > 1 && fits &&
      std::find(members.begin(), members.end(), c.rank()) != members.end();
  if (!mergeable) {
    PassOne(jk.second, std::move(p), RetryDeadline(&view, now),
            PassReason::kNotMergeable, actions);
    return;
  }
  const BlockKey key(c.job_id(), jk.second, c.layer(), c.step(), c.phase(),
                     c.backward_index(), place->group, place->block);
  BlockRound* round = FindOrOpen(key, job, std::move(positions),
                                 std::move(members), p, actions);
  if (round == nullptr) return;  // answered
  Backdate(key, p.contribution, view, now);
  if (round->Add(p.contribution, p.done) == BlockRound::Added::kRefused) {
    // A resend that differs, one after the block went up, a rank the
    // block did not count at its first arrival, or a child's block that
    // does not fit its members here: the shard judges it.
    const absl::Time first = RoundFirst(key);
    PassOne(jk.second, std::move(p), RetryDeadline(&view, first),
            PassReason::kResend, actions, first);
    return;
  }
  if (!round->forwarded() && round->complete()) Complete(key, *round, actions);
}

BlockRound* Relay::FindOrOpen(const BlockKey& key, JobEntry& job,
                              std::vector<int> positions,
                              std::vector<int> members, Pending& p,
                              Actions& actions) {
  auto it = blocks_.find(key);
  if (it != blocks_.end()) return it->second.get();
  const JobView& view = *job.view;
  const absl::Time now = absl::Now();
  if (done_.count(key) > 0) {
    // A late rank or a retry of a block round already answered or
    // released: the shard matches it.
    PassOne(std::get<1>(key), std::move(p), RetryDeadline(&view, now),
            PassReason::kLate, actions);
    return nullptr;
  }
  if (job.open_blocks >= options_.max_pending_blocks_per_job) {
    actions.push_back([c = std::move(p.contribution), done = std::move(p.done),
                       max = options_.max_pending_blocks_per_job] {
      done(
          ErrorAnswer(c, absl::ResourceExhaustedError(absl::StrCat(
                             "the relay holds ", max,
                             " block rounds of this job, its "
                             "--max_pending_blocks_per_job; resend once rounds "
                             "complete"))));
    });
    return nullptr;
  }
  ++job.open_blocks;
  RoundStart& start = round_starts_[RoundKeyOf(key)];
  if (start.open_blocks++ == 0) start.first = now;
  const int block = std::get<7>(key);
  it = blocks_
           .emplace(key, std::make_unique<BlockRound>(
                             std::move(positions), std::move(members),
                             block * options_.block_positions,
                             options_.block_positions))
           .first;
  ScheduleCheck(
      key, std::min(PassAt(view, start.first), now + options_.job_refresh));
  return it->second.get();
}

void Relay::PassOne(int shard, Pending p, absl::Time deadline, PassReason why,
                    Actions& actions, absl::Time started) {
  std::vector<AnswerFn> waiters;
  waiters.push_back(std::move(p.done));
  PassThrough(shard, std::move(p.contribution), std::move(waiters), deadline,
              why, actions, started);
}

absl::Time Relay::RoundFirst(const BlockKey& key) const {
  return round_starts_.at(RoundKeyOf(key)).first;
}

void Relay::Backdate(const BlockKey& key, const v1::Contribution& c,
                     const JobView& view, absl::Time now) {
  if (c.round_age_ms() <= 0) return;
  const absl::Time began = now - absl::Milliseconds(c.round_age_ms());
  RoundStart& start = round_starts_.at(RoundKeyOf(key));
  if (began >= start.first) return;
  start.first = began;
  // The round's blocks here pass through sooner now.
  const BlockKey from(std::get<0>(key), std::get<1>(key), std::get<2>(key),
                      std::get<3>(key), std::get<4>(key), std::get<5>(key),
                      std::numeric_limits<int>::min(),
                      std::numeric_limits<int>::min());
  for (auto it = blocks_.lower_bound(from);
       it != blocks_.end() && RoundKeyOf(it->first) == RoundKeyOf(key); ++it) {
    if (!it->second->forwarded()) {
      ScheduleCheck(it->first, PassAt(view, began));
    }
  }
}

void Relay::Complete(const BlockKey& key, BlockRound& round, Actions& actions) {
  absl::StatusOr<v1::Contribution> merged = round.Merge();
  if (!merged.ok()) {
    Release(key, PassReason::kUnmergeable, actions);
    return;
  }
  // Its ranks' scores of earlier rounds go up with it, never on the path
  // of the round they scored.
  health_.Attach(HealthIdOf(key), *merged);
  round.set_forwarded();
  ++counters_.blocks_forwarded;
  const JobEntry& job = jobs_.at(JobKey(std::get<0>(key), std::get<1>(key)));
  const absl::Time first = RoundFirst(key);
  const absl::Time deadline =
      RetryDeadline(job.view ? &*job.view : nullptr, first);
  // How long the round has been open here: the shard (or the parent)
  // times its grace and deadline from the round's start.
  merged->set_round_age_ms(absl::ToInt64Milliseconds(absl::Now() - first));
  const int shard = std::get<1>(key);
  actions.push_back(
      [this, key, shard, deadline, c = *std::move(merged)]() mutable {
        upstream_.Reduce(
            shard, std::move(c), deadline,
            [this, key](const grpc::Status& status, v1::RoundResult result) {
              BlockAnswered(key, status, std::move(result));
            });
      });
}

void Relay::BlockAnswered(const BlockKey& key, const grpc::Status& status,
                          v1::RoundResult result) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return;
    // The shard refused the block itself (membership moved under it, a
    // check of the block failed, the relay's token lacks the `relay`
    // scope): each rank goes through on its own, which is always exact.
    if (status.error_code() == grpc::StatusCode::ABORTED ||
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      Release(key, PassReason::kRefusedByShard, actions);
    } else {
      std::map<int, HeldContribution> held = it->second->TakeHeld();
      // One answer for the whole block: it carries no rank.
      const RoundAnswer answer =
          status.ok() ? MakeAnswer(std::move(result))
                      : ErrorAnswer(held.begin()->second.contribution,
                                    FromGrpc(status));
      Forget(key);
      actions.push_back([this, id = HealthIdOf(key), held = std::move(held),
                         answer, ok = status.ok()] {
        for (const auto& [rank, h] : held) AnswerAll(h.waiters, answer);
        // After the answers: off the round's critical path.
        if (ok) health_.Score(id, held, answer->result);
      });
    }
  }
  Run(actions);
}

void Relay::Release(const BlockKey& key, PassReason why, Actions& actions) {
  auto it = blocks_.find(key);
  if (it == blocks_.end()) return;
  const absl::Time first = RoundFirst(key);
  std::map<int, HeldContribution> held = it->second->TakeHeld();
  Forget(key);
  const JobEntry& job = jobs_.at(JobKey(std::get<0>(key), std::get<1>(key)));
  const absl::Time deadline =
      RetryDeadline(job.view ? &*job.view : nullptr, first);
  for (auto& [rank, h] : held) {
    PassThrough(std::get<1>(key), std::move(h.contribution),
                std::move(h.waiters), deadline, why, actions, first);
  }
}

void Relay::Forget(const BlockKey& key) {
  if (blocks_.erase(key) == 0) return;
  --jobs_.at(JobKey(std::get<0>(key), std::get<1>(key))).open_blocks;
  auto start = round_starts_.find(RoundKeyOf(key));
  if (start != round_starts_.end() && --start->second.open_blocks == 0) {
    round_starts_.erase(start);
  }
  const int64_t serial = ++done_serial_;
  done_[key] = serial;
  done_order_[serial] = key;
  while (done_order_.size() > static_cast<size_t>(kRememberedBlocks)) {
    auto oldest = done_order_.begin();
    auto d = done_.find(oldest->second);
    if (d != done_.end() && d->second == oldest->first) done_.erase(d);
    done_order_.erase(oldest);
  }
}

void Relay::PassThrough(int shard, v1::Contribution c,
                        std::vector<AnswerFn> waiters, absl::Time deadline,
                        PassReason why, Actions& actions, absl::Time started) {
  ++counters_.passed_through;
  ++counters_.passed_through_by[static_cast<int>(why)];
  if (started != absl::InfiniteFuture()) {
    c.set_round_age_ms(std::max<int64_t>(
        c.round_age_ms(), absl::ToInt64Milliseconds(absl::Now() - started)));
  }
  actions.push_back([this, shard, deadline, c = std::move(c),
                     waiters = std::move(waiters)]() mutable {
    v1::Contribution key;
    key.set_job_id(c.job_id());
    key.set_layer(c.layer());
    key.set_step(c.step());
    key.set_phase(c.phase());
    key.set_backward_index(c.backward_index());
    upstream_.Reduce(
        shard, std::move(c), deadline,
        [key = std::move(key), waiters = std::move(waiters)](
            const grpc::Status& status, v1::RoundResult result) {
          AnswerAll(waiters, status.ok() ? MakeAnswer(std::move(result))
                                         : ErrorAnswer(key, FromGrpc(status)));
        });
  });
}

absl::Time Relay::PassAt(const JobView& view, absl::Time first) const {
  absl::Time at = first + view.round_timeout() - options_.pass_through_margin;
  if (view.quorum_grace().has_value()) {
    at = std::min(at,
                  first + *view.quorum_grace() - options_.pass_through_margin);
  }
  return at;
}

absl::Time Relay::RetryDeadline(const JobView* view, absl::Time first) const {
  if (view == nullptr || view->round_timeout() <= absl::ZeroDuration()) {
    return first + kUnknownJobRetry;
  }
  return first + view->round_timeout();
}

void Relay::ScheduleCheck(const BlockKey& key, absl::Time when) {
  timers_.At(when, [this, key] { Check(key); });
}

void Relay::Check(const BlockKey& key) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second->forwarded()) return;
    const JobKey jk(std::get<0>(key), std::get<1>(key));
    JobEntry& job = jobs_.at(jk);
    const absl::Time now = absl::Now();
    const absl::Time pass_at = PassAt(*job.view, RoundFirst(key));
    if (now >= pass_at) {
      Release(key, PassReason::kIncomplete, actions);
    } else {
      // Reread the job: a membership change may complete the block (a
      // rank removed) or move it.
      if (!job.fetching) Fetch(jk, job, actions);
      ScheduleCheck(key, std::min(pass_at, now + options_.job_refresh));
    }
  }
  Run(actions);
}

void Relay::Recheck(const JobKey& jk, const JobView& view, Actions& actions) {
  std::vector<BlockKey> release;
  for (const auto& entry : blocks_) {
    const BlockKey& key = entry.first;
    const BlockRound* round = entry.second.get();
    if (std::get<0>(key) != jk.first || std::get<1>(key) != jk.second ||
        round->forwarded()) {
      continue;
    }
    std::vector<int> positions;
    std::vector<int> members;
    BlockRanks(view, std::get<6>(key), std::get<7>(key), std::get<3>(key),
               positions, members);
    // A block whose members changed under it goes through: the shard's
    // round waits for the new members leaf by leaf. So does one with a
    // member removed from a later step: the shard's round completes
    // without it at once.
    const int64_t step = std::get<3>(key);
    const bool removed =
        std::any_of(members.begin(), members.end(),
                    [&](int r) { return view.RemovedAfter(r, step); });
    if (!view.accepts_relay_blocks() || members != round->members() ||
        removed) {
      release.push_back(key);
    }
  }
  for (const BlockKey& key : release) {
    Release(key, PassReason::kMembersChanged, actions);
  }
}

}  // namespace syncnorm
