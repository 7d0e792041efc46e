#include "relay/block_health.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/moments.h"
#include "server/domain/rank_score.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

// The moments a rank sent, or none (count 0: not scored) when they do
// not fit the answer's channels.
Moments MomentsOf(const v1::Contribution& c, size_t width) {
  const v1::Moments& sent = c.moments();
  if (sent.count() < 1 || static_cast<size_t>(sent.mean_size()) != width ||
      static_cast<size_t>(sent.m2_size()) != width) {
    return Moments();
  }
  return FromProto(sent);
}

// One rank's entry. The mean shift is against the rest of the group, the
// global merge with the rank taken out: a shifted rank elsewhere inflates
// that center's variance, which only makes the shift look smaller. The
// variance ratio is against the other ranks of the block (`within`, their
// pooled within-rank variance with their own outliers set aside, as the
// shard scores a group): against the rest of the group, any shifted or
// scaled rank elsewhere would make every healthy rank's variance look
// small. Where the block cannot tell (no other rank of it with 2 values),
// the rest of the group serves.
v1::RankHealth ScoreOne(int rank, int64_t step, const Moments& m,
                        const RankScores& within, const GlobalMoments& global,
                        const std::vector<int>& channels) {
  const RankScores group = ScoreRank(
      m, /*in_center=*/false, CenterWithout(global, m, channels), channels);
  const double ratio = std::isnan(within.variance_ratio)
                           ? group.variance_ratio
                           : within.variance_ratio;
  v1::RankHealth out;
  out.set_rank(rank);
  out.set_step(step);
  out.set_count(m.count);
  if (std::isfinite(group.mean_shift)) out.set_mean_shift(group.mean_shift);
  if (std::isfinite(ratio)) out.set_variance_ratio(ratio);
  const int stuck = StuckChannel(m, global.var, /*tracked=*/-1);
  if (stuck >= 0) out.set_stuck_channel(stuck);
  return out;
}

// Whether rank `r` is in the (first, last) runs of `runs`.
bool InRuns(const google::protobuf::RepeatedField<int32_t>& runs, int r) {
  for (int k = 0; k + 1 < runs.size(); k += 2) {
    if (runs[k] <= r && r <= runs[k + 1]) return true;
  }
  return false;
}

}  // namespace

void BlockHealth::Score(const BlockId& id,
                        const std::map<int, HeldContribution>& held,
                        const v1::RoundResult& answer) {
  if (answer.phase() != v1::FORWARD || !answer.has_moments()) return;
  const GlobalMoments global = FromProto(answer.moments());
  if (global.var.size() != global.mean.size()) return;
  const size_t width = global.mean.size();
  const std::vector<int> channels = ScoredChannels(static_cast<int>(width));
  std::vector<int> ranks;
  std::vector<Moments> moments;
  for (const auto& [rank, h] : held) {
    // A child relay's block: its relay scored its ranks, and their entries
    // came up in it (BlockRound::Merge passes them on).
    if (h.contribution.has_relay()) continue;
    ranks.push_back(rank);
    moments.push_back(MomentsOf(h.contribution, width));
  }
  const std::vector<RankScores> within =
      ScoreAmongThemselves(moments, static_cast<int>(width));
  std::vector<v1::RankHealth> entries;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (moments[i].count < 1) continue;  // no batch, or not the layer's
    entries.push_back(ScoreOne(ranks[i], answer.step(), moments[i], within[i],
                               global, channels));
  }
  if (entries.empty()) return;
  absl::MutexLock lock(&mu_);
  ranks_scored_ += static_cast<int64_t>(entries.size());
  entries_held_ += static_cast<int64_t>(entries.size());
  Pending& p = pending_[id];
  by_serial_.erase(p.last_scored);
  p.last_scored = ++serial_;
  by_serial_[p.last_scored] = id;
  // In step order, though answers of a block's rounds may be scored out
  // of it: the shard skips a rank's round older than one it has tracked.
  const int64_t step = answer.step();
  auto at = std::find_if(p.rounds.begin(), p.rounds.end(),
                         [step](const std::vector<v1::RankHealth>& r) {
                           return r.front().step() > step;
                         });
  p.rounds.insert(at, std::move(entries));
  while (p.rounds.size() > static_cast<size_t>(kMaxRounds)) PopOldest(p);
  while (entries_held_ > kMaxEntries) {
    Erase(pending_.find(by_serial_.begin()->second));
  }
}

void BlockHealth::Attach(const BlockId& id, v1::Contribution& c) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  const int64_t last = c.phase() == v1::FORWARD ? c.step() - 1 : c.step();
  v1::RelayBlock& block = *c.mutable_relay();
  std::deque<std::vector<v1::RankHealth>>& rounds = it->second.rounds;
  for (auto round = rounds.begin(); round != rounds.end();) {
    // A round's entries share its step.
    if (round->empty() || round->front().step() > last) {
      ++round;
      continue;
    }
    for (v1::RankHealth& e : *round) {
      if (!InRuns(block.rank_runs(), e.rank())) continue;
      *block.add_health() = std::move(e);
      ++entries_sent_;
    }
    entries_held_ -= static_cast<int64_t>(round->size());
    round = rounds.erase(round);
  }
  if (rounds.empty()) Erase(it);
}

void BlockHealth::PopOldest(Pending& p) {
  entries_held_ -= static_cast<int64_t>(p.rounds.front().size());
  p.rounds.pop_front();
}

void BlockHealth::Erase(std::map<BlockId, Pending>::iterator it) {
  while (!it->second.rounds.empty()) PopOldest(it->second);
  by_serial_.erase(it->second.last_scored);
  pending_.erase(it);
}

int64_t BlockHealth::ranks_scored() const {
  absl::MutexLock lock(&mu_);
  return ranks_scored_;
}

int64_t BlockHealth::entries_sent() const {
  absl::MutexLock lock(&mu_);
  return entries_sent_;
}

}  // namespace syncnorm
