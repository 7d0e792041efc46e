#include "server/domain/round_observer.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/domain/bounded_text.h"
#include "server/domain/stats_health.h"

namespace syncnorm {
namespace {

// The most ranks a summary names; "+Nmore" says how many more there were.
constexpr size_t kMaxRanksShown = 16;

// Holds the one line written to it, for LoggingRoundObserver::Line.
class OneLine final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    line_ = std::string(absl::StripSuffix(line, "\n"));
  }
  const std::string& line() const { return line_; }

 private:
  std::string line_;
};

// `ranks` (ascending) in the summaries' own compact form: the first
// kMaxRanksShown, then "+Nmore", so that a round of a job with thousands of
// ranks writes a line of the same size as one of a job with a few.
template <typename Ranks>
std::string ShownRanks(const Ranks& ranks) {
  std::vector<int> shown;
  for (int r : ranks) {
    if (shown.size() == kMaxRanksShown) break;
    shown.push_back(r);
  }
  const size_t more = ranks.size() - shown.size();
  return absl::StrCat("[", absl::StrJoin(shown, ","),
                      more > 0 ? absl::StrCat(",+", more, "more") : "", "]");
}

}  // namespace

LoggingRoundObserver::LoggingRoundObserver(Options options)
    : interval_(std::max(options.interval, absl::ZeroDuration())),
      sink_(options.sink != nullptr ? *options.sink : StderrLog()) {}

void LoggingRoundObserver::Write(LogSink& sink, const char* event,
                                 LogLevel level, const RoundReport& r) {
  LogLine line(event, level, sink);
  line.Add("job", BoundedText(r.job_id))
      .Add("group", r.group)
      .Add("layer", r.layer)
      .Add("step", r.step)
      .Add("phase", PhaseName(r.phase))
      .Add("latency_ms", absl::ToInt64Milliseconds(r.latency))
      .Add("last_arrival_ms", absl::ToInt64Milliseconds(r.last_arrival))
      .Add("contributors", ShownRanks(r.contributors))
      .Add("stragglers", ShownRanks(r.stragglers))
      .Add("missing", ShownRanks(r.missing_ranks));
  if (!r.status.ok()) {
    line.Add("status", absl::StatusCodeToString(r.status.code()));
  }
}

std::string LoggingRoundObserver::Line(const char* event,
                                       const RoundReport& report) {
  OneLine sink;
  Write(sink, event, LogLevel::kWarn, report);
  return sink.line();
}

void LoggingRoundObserver::OnRoundCompleted(const RoundReport& report) {
  if (!report.status.ok()) {
    Write(sink_, "round_failed", LogLevel::kWarn, report);
  } else if (report.quorum) {
    Fold(kQuorum, report);
  } else if (!report.stragglers.empty()) {
    Fold(kStraggler, report);
  }
}

void LoggingRoundObserver::OnDeadline(const RoundReport& report) {
  Write(sink_, "deadline", LogLevel::kError, report);
}

void LoggingRoundObserver::Fold(Kind kind, const RoundReport& report) {
  const char* event = kind == kQuorum ? "quorum" : "straggler";
  if (interval_ == absl::ZeroDuration()) {
    Write(sink_, event, LogLevel::kWarn, report);
    return;
  }
  absl::MutexLock lock(&mu_);
  const WindowKey key(report.job_id, kind);
  auto it = windows_.find(key);
  if (it != windows_.end() && report.ended >= it->second.end) {
    if (it->second.rounds > 1) WriteSummary(key, it->second);
    windows_.erase(it);
    it = windows_.end();
  }
  if (it == windows_.end()) {
    // The first of an interval: said at once, in full.
    it = windows_.emplace(key, Window()).first;
    it->second.end = report.ended + interval_;
    it->second.first_step = it->second.last_step = report.step;
    Write(sink_, event, LogLevel::kWarn, report);
  }
  Window& w = it->second;
  ++w.rounds;
  w.layers.insert(report.layer);
  w.first_step = std::min(w.first_step, report.step);
  w.last_step = std::max(w.last_step, report.step);
  const std::vector<int>& ranks =
      kind == kQuorum ? report.missing_ranks : report.stragglers;
  w.ranks.insert(ranks.begin(), ranks.end());
  w.max_latency = std::max(w.max_latency, report.latency);
}

void LoggingRoundObserver::WriteSummary(const WindowKey& key, const Window& w) {
  const bool quorum = key.second == kQuorum;
  LogLine(quorum ? "quorum_summary" : "straggler_summary", LogLevel::kWarn,
          sink_)
      .Add("job", BoundedText(key.first))
      .Add("interval_ms", absl::ToInt64Milliseconds(interval_))
      .Add("rounds", w.rounds)
      .Add("layers", w.layers.size())
      .Add("first_step", w.first_step)
      .Add("last_step", w.last_step)
      .Add(quorum ? "missing" : "stragglers", ShownRanks(w.ranks))
      .Add("max_latency_ms", absl::ToInt64Milliseconds(w.max_latency));
}

void LoggingRoundObserver::OnStatsHealth(const StatsHealthReport& r) {
  const HealthFlag& f = r.flag;
  LogLine line(r.raised ? "stats_health_flag" : "stats_health_cleared",
               r.raised ? LogLevel::kWarn : LogLevel::kInfo, sink_);
  line.Add("job", BoundedText(r.job_id))
      .Add("group", f.group)
      .Add("layer", f.layer)
      .Add("layer_name", BoundedText(f.layer_name))
      .Add("rank", f.rank)
      .Add("kind", HealthKindName(f.kind));
  if (f.channel >= 0) line.Add("channel", f.channel);
  line.Add("first_step", f.first_step)
      .Add("step", r.raised ? f.last_step : f.cleared_step)
      .Add("score", absl::StrFormat("%.3g", f.score));
}

void LoggingRoundObserver::OnTick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (it->second.end > now) {
      ++it;
      continue;
    }
    if (it->second.rounds > 1) WriteSummary(it->first, it->second);
    it = windows_.erase(it);
  }
}

}  // namespace syncnorm
