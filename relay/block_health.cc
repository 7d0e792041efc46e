#include "relay/block_health.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/moments.h"
#include "server/domain/rank_score.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

// One rank's entry, or nothing to send (no batch, moments of another
// width than the answer's).
bool ScoreOne(int rank, int64_t step, const v1::Moments& sent,
              const GlobalMoments& global, const std::vector<int>& channels,
              v1::RankHealth& out) {
  const size_t width = global.mean.size();
  if (sent.count() < 1 || static_cast<size_t>(sent.mean_size()) != width ||
      static_cast<size_t>(sent.m2_size()) != width) {
    return false;
  }
  const Moments m = FromProto(sent);
  const RankScores s =
      ScoreRank(m, /*in_center=*/false, CenterWithout(global, m, channels),
                channels);
  out.set_rank(rank);
  out.set_step(step);
  out.set_count(m.count);
  if (std::isfinite(s.mean_shift)) out.set_mean_shift(s.mean_shift);
  if (std::isfinite(s.variance_ratio)) out.set_variance_ratio(s.variance_ratio);
  const int stuck = StuckChannel(m, global.var, /*tracked=*/-1);
  if (stuck >= 0) out.set_stuck_channel(stuck);
  return true;
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
  const std::vector<int> channels =
      ScoredChannels(static_cast<int>(global.mean.size()));
  std::vector<v1::RankHealth> entries;
  for (const auto& [rank, h] : held) {
    v1::RankHealth e;
    if (ScoreOne(rank, answer.step(), h.contribution.moments(), global,
                 channels, e)) {
      entries.push_back(std::move(e));
    }
  }
  if (entries.empty()) return;
  absl::MutexLock lock(&mu_);
  ranks_scored_ += static_cast<int64_t>(entries.size());
  entries_held_ += static_cast<int64_t>(entries.size());
  Pending& p = pending_[id];
  by_serial_.erase(p.last_scored);
  p.last_scored = ++serial_;
  by_serial_[p.last_scored] = id;
  p.rounds.push_back(std::move(entries));
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
