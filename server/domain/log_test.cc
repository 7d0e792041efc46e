#include "server/domain/log.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

class Lines final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  }
  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

const absl::Time kTime =
    absl::FromUnixMillis(1740830400123);  // 2025-03-01T12:00:00.123Z

TEST(LogLineTest, TimestampLevelEventThenKeys) {
  Lines sink;
  LogLine("job_created", LogLevel::kInfo, sink, kTime)
      .Add("job", "run7")
      .Add("layers", 53);
  LogLine("deadline", LogLevel::kError, sink, kTime).Add("missing", "[5]");
  LogLine("straggler", LogLevel::kWarn, sink, kTime + absl::Milliseconds(9));
  EXPECT_EQ(sink.lines(),
            (std::vector<std::string>{
                "ts=2025-03-01T12:00:00.123Z level=info event=job_created "
                "job=run7 layers=53\n",
                "ts=2025-03-01T12:00:00.123Z level=error event=deadline "
                "missing=[5]\n",
                "ts=2025-03-01T12:00:00.132Z level=warn event=straggler\n"}));
}

// A value can neither end the line nor forge another key.
TEST(LogLineTest, ValuesThatNeedItAreQuotedAndEscaped) {
  EXPECT_EQ(LogLine::Quoted("plain-1.0"), "plain-1.0");
  EXPECT_EQ(LogLine::Quoted(""), "\"\"");
  EXPECT_EQ(LogLine::Quoted("a b"), "\"a b\"");
  EXPECT_EQ(LogLine::Quoted("k=v"), "\"k=v\"");
  EXPECT_EQ(LogLine::Quoted("say \"hi\""), "\"say \\\"hi\\\"\"");
  EXPECT_EQ(LogLine::Quoted("back\\slash"), "\"back\\\\slash\"");
  EXPECT_EQ(LogLine::Quoted("it's"), "it's");
  EXPECT_EQ(LogLine::Quoted("two\nlines\r\t"), "\"two\\nlines\\r\\t\"");
  EXPECT_EQ(LogLine::Quoted(std::string("nul\0\x7f\xc3\xa9", 7)),
            "\"nul\\x00\\x7f\\xc3\\xa9\"");
  Lines sink;
  LogLine("e", LogLevel::kInfo, sink, kTime)
      .Add("message", "x\nts=forged level=error event=forged");
  ASSERT_EQ(sink.lines().size(), 1u);
  EXPECT_EQ(sink.lines()[0],
            "ts=2025-03-01T12:00:00.123Z level=info event=e message=\"x\\nts="
            "forged level=error event=forged\"\n");
}

}  // namespace
}  // namespace syncnorm
