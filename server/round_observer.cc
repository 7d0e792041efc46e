#include "server/round_observer.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/bounded_text.h"

namespace syncnorm {

std::string LoggingRoundObserver::Line(const char* event,
                                       const RoundReport& r) {
  std::string line = absl::StrCat(
      "syncnorm event=", event, " job=", BoundedText(r.job_id),
      " group=", r.group, " layer=", r.layer, " step=", r.step,
      " phase=", PhaseName(r.phase),
      " latency_ms=", absl::ToInt64Milliseconds(r.latency),
      " last_arrival_ms=", absl::ToInt64Milliseconds(r.last_arrival),
      " contributors=[", absl::StrJoin(r.contributors, ","), "] stragglers=[",
      absl::StrJoin(r.stragglers, ","), "] missing=[",
      absl::StrJoin(r.missing_ranks, ","), "]");
  if (!r.status.ok()) {
    absl::StrAppend(&line, " status=", absl::StatusCodeToString(r.status.code()));
  }
  return line;
}

namespace {

// One write per line, so that lines of concurrent rounds do not interleave.
void Emit(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

void LoggingRoundObserver::OnRoundCompleted(const RoundReport& report) {
  if (!report.status.ok()) {
    Emit(Line("round_failed", report));
  } else if (report.quorum) {
    Emit(Line("quorum", report));
  } else if (!report.stragglers.empty()) {
    Emit(Line("straggler", report));
  }
}

void LoggingRoundObserver::OnDeadline(const RoundReport& report) {
  Emit(Line("deadline", report));
}

}  // namespace syncnorm
