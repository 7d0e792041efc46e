#include "server/domain/stats_health.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "server/domain/rank_score.h"
#include "server/domain/round_observer.h"

namespace syncnorm {
namespace {

// The scored kinds, by their index in StatsHealth::RankRuns.
constexpr HealthKind kScored[2] = {HealthKind::kMeanShift,
                                   HealthKind::kVarianceRatio};

}  // namespace

const char* HealthKindName(HealthKind kind) {
  switch (kind) {
    case HealthKind::kMeanShift:
      return "mean_shift";
    case HealthKind::kVarianceRatio:
      return "variance_ratio";
    case HealthKind::kStuckChannel:
      return "stuck_channel";
    case HealthKind::kDeadChannel:
      return "dead_channel";
  }
  return "unknown";
}

HealthFlag StatsHealth::RankFlag(const RankKey& key, const RankRuns& runs,
                                 HealthKind kind) {
  HealthFlag flag;
  flag.kind = kind;
  flag.layer = std::get<0>(key);
  flag.group = std::get<1>(key);
  flag.rank = std::get<2>(key);
  flag.last_step = runs.last_step;
  if (kind == HealthKind::kStuckChannel) {
    flag.channel = runs.stuck_channel;
    flag.first_step = runs.stuck_first;
    flag.score = static_cast<double>(runs.stuck_evidence);
  } else {
    const int k = kind == HealthKind::kMeanShift ? 0 : 1;
    flag.first_step = runs.first[k];
    flag.score = runs.score[k];
  }
  return flag;
}

HealthFlag StatsHealth::DeadFlag(const LayerKey& key, const LayerRuns& runs) {
  HealthFlag flag;
  flag.kind = HealthKind::kDeadChannel;
  flag.layer = key.first;
  flag.group = key.second;
  flag.channel = runs.dead_channel;
  flag.first_step = runs.dead_start;
  flag.last_step = runs.last_step;
  flag.score = runs.dead_count;
  return flag;
}

bool StatsHealth::RankRuns::Idle() const {
  return beyond[0] == 0 && beyond[1] == 0 && !on[0] && !on[1] &&
         stuck_channel < 0 && !stuck_on;
}

StatsHealth::StatsHealth(std::string job_id,
                         std::vector<std::string> layer_names,
                         RoundObserver* observer)
    : job_id_(std::move(job_id)),
      layer_names_(std::move(layer_names)),
      observer_(observer) {}

StatsHealth::~StatsHealth() {
  if (observer_ == nullptr) return;
  const StatsHealthSnapshot snap = Snapshot(std::numeric_limits<int>::max());
  for (HealthFlag flag : snap.flags) {
    if (!flag.active) continue;
    flag.active = false;
    flag.cleared_step = flag.last_step;
    observer_->OnStatsHealth(Report(flag, /*raised=*/false));
  }
}

std::vector<RankScores> StatsHealth::ScoreAll(const HealthSample& s) {
  if (s.global.mean.empty()) return std::vector<RankScores>(s.moments.size());
  return ScoreAmongThemselves(s.moments,
                              static_cast<int>(s.global.mean.size()));
}

std::vector<std::pair<double, double>> StatsHealth::Scores(
    const HealthSample& s) {
  std::vector<std::pair<double, double>> out;
  for (const RankScores& r : ScoreAll(s)) {
    out.emplace_back(r.mean_shift, r.variance_ratio);
  }
  return out;
}

const std::string& StatsHealth::NameOf(int layer) const {
  static const std::string* const kNone = new std::string();
  return layer >= 0 && layer < static_cast<int>(layer_names_.size())
             ? layer_names_[layer]
             : *kNone;
}

StatsHealthReport StatsHealth::Report(const HealthFlag& flag,
                                      bool raised) const {
  StatsHealthReport r;
  r.job_id = job_id_;
  r.flag = flag;
  r.flag.layer_name = NameOf(flag.layer);
  r.raised = raised;
  return r;
}

void StatsHealth::Cleared(HealthFlag flag, int64_t step,
                          std::vector<StatsHealthReport>& out) {
  flag.active = false;
  flag.cleared_step = step;
  flag.layer_name = NameOf(flag.layer);
  out.push_back(Report(flag, /*raised=*/false));
  cleared_.push_front(std::move(flag));
  if (cleared_.size() > static_cast<size_t>(kMaxCleared)) cleared_.pop_back();
}

void StatsHealth::ScoreRanks(const HealthSample& s,
                             std::vector<StatsHealthReport>& out) {
  const std::vector<RankScores> scores = ScoreAll(s);
  for (size_t i = 0; i < s.moments.size(); ++i) {
    const Moments& m = s.moments[i];
    if (m.count < 1) continue;  // no batch: neither evidence nor clearance
    const RankKey key(s.layer, s.group, s.ranks[i]);
    auto it = ranks_.find(key);
    const int tracked = it != ranks_.end() ? it->second.stuck_channel : -1;
    Track(key, s.step, m.count, scores[i],
          StuckChannel(m, s.global.var, tracked), out);
  }
}

void StatsHealth::Track(const RankKey& key, int64_t step, int64_t count,
                        const RankScores& scores, int stuck,
                        std::vector<StatsHealthReport>& out) {
  auto it = ranks_.find(key);
  if (it == ranks_.end()) {
    if (ScoreExcess(scores) <= kThreshold && stuck < 0) return;  // healthy
    if (static_cast<int>(ranks_.size()) >= kMaxTracked) return;
    it = ranks_.emplace(key, RankRuns()).first;
  }
  RankRuns& runs = it->second;
  runs.last_step = step;
  const double values[2] = {scores.mean_shift, scores.variance_ratio};
  for (int k = 0; k < 2; ++k) {
    if (std::isnan(values[k])) continue;
    const bool bad =
        k == 0 ? values[k] > kThreshold : std::abs(values[k]) > kThreshold;
    runs.score[k] = values[k];
    if (bad) {
      if (runs.beyond[k]++ == 0) runs.run_start[k] = step;
      runs.within[k] = 0;
      if (!runs.on[k] && runs.beyond[k] >= kRun) {
        runs.on[k] = true;
        runs.first[k] = runs.run_start[k];
        out.push_back(Report(RankFlag(key, runs, kScored[k]), /*raised=*/true));
      }
    } else {
      runs.beyond[k] = 0;
      if (runs.on[k] && ++runs.within[k] >= kRun) {
        runs.on[k] = false;
        runs.within[k] = 0;
        Cleared(RankFlag(key, runs, kScored[k]), step, out);
      }
    }
  }
  if (count >= 2) TrackStuck(key, runs, step, count, stuck, out);
  if (runs.Idle()) ranks_.erase(it);
}

void StatsHealth::TrackStuck(const RankKey& key, RankRuns& runs, int64_t step,
                             int64_t count, int stuck,
                             std::vector<StatsHealthReport>& out) {
  if (stuck >= 0 && stuck == runs.stuck_channel) {
    runs.stuck_evidence += count - 1;
  } else {
    if (runs.stuck_on) {
      runs.stuck_on = false;
      Cleared(RankFlag(key, runs, HealthKind::kStuckChannel), step, out);
    }
    runs.stuck_channel = stuck;
    runs.stuck_evidence = stuck >= 0 ? count - 1 : 0;
    runs.stuck_start = step;
  }
  if (stuck >= 0 && !runs.stuck_on && runs.stuck_evidence >= kStuckEvidence) {
    runs.stuck_on = true;
    runs.stuck_first = runs.stuck_start;
    out.push_back(Report(RankFlag(key, runs, HealthKind::kStuckChannel),
                         /*raised=*/true));
  }
}

void StatsHealth::ObserveRelayed(int group, int layer,
                                 const std::vector<RankHealth>& entries) {
  std::vector<StatsHealthReport> reports;
  {
    absl::MutexLock lock(&mu_);
    for (const RankHealth& e : entries) {
      if (e.count < 1) continue;
      const RankKey key(layer, group, e.rank);
      // A resent entry, or one of a round this shard scored itself since
      // (the rank sent directly), is scored once.
      auto it = ranks_.find(key);
      if (it != ranks_.end() && e.step <= it->second.last_step) continue;
      RankScores scores;
      scores.mean_shift = e.mean_shift;
      scores.variance_ratio = e.variance_ratio;
      Track(key, e.step, e.count, scores, e.stuck_channel, reports);
    }
  }
  if (observer_ == nullptr) return;
  for (const StatsHealthReport& r : reports) observer_->OnStatsHealth(r);
}

void StatsHealth::CheckDead(const HealthSample& s,
                            std::vector<StatsHealthReport>& out) {
  if (s.global.count < 2) return;
  const std::vector<double>& var = s.global.var;
  int lowest = -1, dead = 0;
  for (size_t c = 0; c < var.size(); ++c) {
    if (var[c] == 0) {
      if (lowest < 0) lowest = static_cast<int>(c);
      ++dead;
    }
  }
  const LayerKey key(s.layer, s.group);
  auto it = layers_.find(key);
  if (it == layers_.end()) {
    if (dead == 0) return;
    it = layers_.emplace(key, LayerRuns()).first;
  }
  LayerRuns& runs = it->second;
  runs.last_step = s.step;
  const int tracked = runs.dead_channel;
  const bool still = tracked >= 0 && tracked < static_cast<int>(var.size()) &&
                     var[tracked] == 0;
  if (still) {
    ++runs.dead_run;
  } else {
    if (runs.dead_on) {
      runs.dead_on = false;
      Cleared(DeadFlag(key, runs), s.step, out);
    }
    runs.dead_channel = lowest;
    runs.dead_run = lowest >= 0 ? 1 : 0;
    runs.dead_start = s.step;
  }
  runs.dead_count = dead;
  if (runs.dead_channel >= 0 && !runs.dead_on && runs.dead_run >= kDeadRun) {
    runs.dead_on = true;
    out.push_back(Report(DeadFlag(key, runs), /*raised=*/true));
  }
  if (runs.dead_channel < 0 && !runs.dead_on) layers_.erase(it);
}

void StatsHealth::Observe(const HealthSample& sample) {
  std::vector<StatsHealthReport> reports;
  {
    absl::MutexLock lock(&mu_);
    ++rounds_scored_;
    ScoreRanks(sample, reports);
    CheckDead(sample, reports);
  }
  if (observer_ == nullptr) return;
  for (const StatsHealthReport& r : reports) observer_->OnStatsHealth(r);
}

void StatsHealth::CountNonFinite(int rank) {
  {
    absl::MutexLock lock(&mu_);
    ++nonfinite_[rank];
    ++nonfinite_total_;
  }
  if (observer_ != nullptr) observer_->OnNonFinite(job_id_, rank);
}

StatsHealthSnapshot StatsHealth::Snapshot(int limit) const {
  absl::MutexLock lock(&mu_);
  StatsHealthSnapshot snap;
  snap.nonfinite_total = nonfinite_total_;
  snap.rounds_scored = rounds_scored_;
  const auto add = [&](HealthFlag flag) {
    ++snap.flags_in_force;
    if (static_cast<int>(snap.flags.size()) < limit) {
      flag.layer_name = NameOf(flag.layer);
      snap.flags.push_back(std::move(flag));
    }
  };
  // By layer, group, rank: a layer's own flag (rank -1) first.
  auto layer = layers_.begin();
  for (const auto& [key, runs] : ranks_) {
    const LayerKey layer_key(std::get<0>(key), std::get<1>(key));
    for (; layer != layers_.end() && layer->first <= layer_key; ++layer) {
      if (layer->second.dead_on) add(DeadFlag(layer->first, layer->second));
    }
    for (int k = 0; k < 2; ++k) {
      if (runs.on[k]) add(RankFlag(key, runs, kScored[k]));
    }
    if (runs.stuck_on) add(RankFlag(key, runs, HealthKind::kStuckChannel));
  }
  for (; layer != layers_.end(); ++layer) {
    if (layer->second.dead_on) add(DeadFlag(layer->first, layer->second));
  }
  for (const HealthFlag& flag : cleared_) {
    if (static_cast<int>(snap.flags.size()) >= limit) break;
    snap.flags.push_back(flag);
  }
  for (const auto& [rank, n] : nonfinite_) snap.refused.emplace_back(rank, n);
  std::stable_sort(
      snap.refused.begin(), snap.refused.end(),
      [](const auto& a, const auto& b) { return a.second > b.second; });
  if (static_cast<int>(snap.refused.size()) > limit) snap.refused.resize(limit);
  return snap;
}

}  // namespace syncnorm
