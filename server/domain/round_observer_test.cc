// LoggingRoundObserver: which rounds get a line, and how a job's repeated
// straggler and quorum rounds are counted into one line per interval, on
// report times given by the test.
#include "server/domain/round_observer.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/domain/log.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

class Lines final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  }
  std::vector<std::string> TakeAll() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    out.swap(lines_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

RoundReport Quorum(const std::string& job, int layer, int64_t step,
                   absl::Duration at) {
  RoundReport r;
  r.job_id = job;
  r.layer = layer;
  r.step = step;
  r.phase = Phase::kForward;
  r.contributors = {0, 1, 2};
  r.missing_ranks = {3};
  r.quorum = true;
  r.latency = absl::Milliseconds(20 + layer);
  r.ended = kT0 + at;
  return r;
}

RoundReport Straggler(const std::string& job, int layer, int64_t step,
                      absl::Duration at) {
  RoundReport r = Quorum(job, layer, step, at);
  r.quorum = false;
  r.contributors = {0, 1, 2, 3};
  r.missing_ranks = {};
  r.stragglers = {2};
  return r;
}

class LoggingRoundObserverTest : public ::testing::Test {
 protected:
  LoggingRoundObserver::Options Options(absl::Duration interval) {
    LoggingRoundObserver::Options o;
    o.interval = interval;
    o.sink = &lines_;
    return o;
  }
  Lines lines_;
};

// A job with 7 layers and one absent rank: 15 s of steps, one every 100 ms,
// is two intervals of 10 s: two lines each, not 7 per step.
TEST_F(LoggingRoundObserverTest, AJobsQuorumRoundsAreTwoLinesPerInterval) {
  LoggingRoundObserver observer(Options(absl::Seconds(10)));
  int64_t step = 0;
  for (absl::Duration at = absl::ZeroDuration(); at < absl::Seconds(15);
       at += absl::Milliseconds(100), ++step) {
    for (int layer = 0; layer < 7; ++layer) {
      observer.OnRoundCompleted(Quorum("j", layer, step, at));
    }
    observer.OnTick(kT0 + at);
  }
  observer.OnTick(kT0 + absl::Seconds(25));
  const std::vector<std::string> lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 4u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], HasSubstr("level=warn event=quorum job=j group=0 "
                                  "layer=0 step=0 phase=FORWARD "));
  EXPECT_THAT(lines[0], HasSubstr(" missing=[3]"));
  // Steps 0-99 (10 s), the first one's round included.
  EXPECT_THAT(lines[1],
              HasSubstr("level=warn event=quorum_summary job=j "
                        "interval_ms=10000 rounds=700 layers=7 first_step=0 "
                        "last_step=99 missing=[3] max_latency_ms=26\n"));
  EXPECT_THAT(lines[2], HasSubstr("event=quorum job=j group=0 layer=0 "
                                  "step=100 "));
  EXPECT_THAT(lines[3], HasSubstr("event=quorum_summary job=j "
                                  "interval_ms=10000 rounds=350 layers=7 "
                                  "first_step=100 last_step=149 "));
}

// Jobs and kinds have windows of their own; failed and expired rounds are
// never folded; a window that saw one round needs no summary.
TEST_F(LoggingRoundObserverTest, WindowsPerJobAndKindFailuresAlwaysSaid) {
  LoggingRoundObserver observer(Options(absl::Seconds(10)));
  observer.OnRoundCompleted(Quorum("a", 0, 0, absl::ZeroDuration()));
  observer.OnRoundCompleted(Straggler("a", 1, 0, absl::Seconds(1)));
  observer.OnRoundCompleted(Quorum("b", 0, 0, absl::Seconds(1)));
  observer.OnRoundCompleted(Quorum("a", 1, 0, absl::Seconds(2)));
  RoundReport failed = Quorum("a", 2, 0, absl::Seconds(2));
  failed.quorum = false;
  failed.status = absl::InvalidArgumentError("overflow");
  observer.OnRoundCompleted(failed);
  observer.OnRoundCompleted(failed);
  RoundReport expired = Quorum("a", 3, 0, absl::Seconds(3));
  expired.quorum = false;
  expired.status = absl::DeadlineExceededError("late");
  observer.OnDeadline(expired);
  observer.OnDeadline(expired);
  std::vector<std::string> lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 7u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], HasSubstr("event=quorum job=a "));
  EXPECT_THAT(lines[1], HasSubstr("event=straggler job=a "));
  EXPECT_THAT(lines[2], HasSubstr("event=quorum job=b "));
  EXPECT_THAT(lines[3], HasSubstr("level=warn event=round_failed job=a "));
  EXPECT_THAT(lines[3], HasSubstr(" status=INVALID_ARGUMENT"));
  EXPECT_THAT(lines[5], HasSubstr("level=error event=deadline job=a "));
  EXPECT_THAT(lines[6], HasSubstr(" status=DEADLINE_EXCEEDED"));

  observer.OnTick(kT0 + absl::Seconds(9));
  EXPECT_TRUE(lines_.TakeAll().empty()) << "no window has ended yet";
  observer.OnTick(kT0 + absl::Seconds(11));
  lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 1u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], HasSubstr("event=quorum_summary job=a "
                                  "interval_ms=10000 rounds=2 layers=2 "));
  // Every window has ended: the next round opens a new one, said in full.
  observer.OnRoundCompleted(Quorum("b", 0, 1, absl::Seconds(12)));
  lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("event=quorum job=b "));
}

TEST_F(LoggingRoundObserverTest, ZeroIntervalSaysEveryRound) {
  LoggingRoundObserver observer(Options(absl::ZeroDuration()));
  for (int step = 0; step < 3; ++step) {
    observer.OnRoundCompleted(Straggler("j", 0, step, absl::ZeroDuration()));
  }
  observer.OnTick(absl::InfiniteFuture());
  const std::vector<std::string> lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[2], HasSubstr("event=straggler job=j group=0 layer=0 "
                                  "step=2 "));
}

// A summary names at most 16 ranks, and how many more there were.
TEST_F(LoggingRoundObserverTest, ASummaryNamesBoundedRanks) {
  LoggingRoundObserver observer(Options(absl::Seconds(10)));
  for (int rank = 0; rank < 40; ++rank) {
    RoundReport r = Quorum("wide", 0, rank, absl::Milliseconds(rank));
    r.missing_ranks = {rank + 100};
    observer.OnRoundCompleted(r);
  }
  observer.OnTick(absl::InfiniteFuture());
  const std::vector<std::string> lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[1],
              HasSubstr(" missing=[100,101,102,103,104,105,106,107,108,109,"
                        "110,111,112,113,114,115,+24more] "));
}

// A failed round of a job of 1,024 ranks, rank 0 alone: its line names at
// most 16 ranks of each list, as a summary does.
TEST_F(LoggingRoundObserverTest, AWideRoundsLineNamesBoundedRanks) {
  LoggingRoundObserver observer(Options(absl::Seconds(10)));
  RoundReport r = Quorum("wide", 0, 7, absl::ZeroDuration());
  r.quorum = false;
  r.status = absl::DeadlineExceededError("late");
  r.contributors = {0};
  r.missing_ranks.clear();
  for (int rank = 1; rank < 1024; ++rank) r.missing_ranks.push_back(rank);
  observer.OnDeadline(r);
  const std::vector<std::string> lines = lines_.TakeAll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(" missing=[1,2,3,4,5,6,7,8,9,10,11,12,13,"
                                  "14,15,16,+1007more] "));
  EXPECT_LE(lines[0].size(), 512u) << lines[0];
}

}  // namespace
}  // namespace syncnorm
