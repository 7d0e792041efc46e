// The aggregator's log: one line per event on stderr, every line in one
// format, so that a log pipeline parses all of them as key=value pairs:
//   ts=2025-03-01T12:00:00.123Z level=info event=job_created job=run7 ...
// ts is the UTC wall time to the millisecond, level one of info, warn and
// error, event a fixed word, then the event's own keys. A value that is
// empty or holds a space, '"', '=', '\' or a byte outside printable ASCII
// is double-quoted, with '"' and '\' backslash-escaped and other such bytes
// written as \n, \r, \t or \xHH, so that a value never ends a line or
// forges a key. Callers log names (bounded, see bounded_text.h), counts and
// codes; never a secret (a token, a key, a payload), whatever its source.
#ifndef SYNCNORM_SERVER_DOMAIN_LOG_H_
#define SYNCNORM_SERVER_DOMAIN_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace syncnorm {

enum class LogLevel { kInfo, kWarn, kError };

// "info", "warn" or "error".
inline const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kInfo:
    default:
      return "info";
  }
}

// Where finished lines go. Write gets one whole line, '\n' included.
// Implementations are thread-safe and keep lines whole.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Write(absl::string_view line) = 0;
};

// The process's stderr: one write per line, so that the lines of
// concurrent writers do not interleave.
class StderrLogSink final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
};

// The stderr sink every LogLine uses unless given another.
inline LogSink& StderrLog() {
  static StderrLogSink* const sink = new StderrLogSink();
  return *sink;
}

// Builds one line and writes it to its sink when destroyed:
//   LogLine("checkpoint").Add("job", id).Add("step", step);
//   LogLine("deadline", LogLevel::kError).Add(...);
// Thread-compatible.
class LogLine {
 public:
  explicit LogLine(absl::string_view event, LogLevel level = LogLevel::kInfo,
                   LogSink& sink = StderrLog(), absl::Time time = absl::Now())
      : sink_(sink),
        line_(absl::StrCat(
            "ts=",
            absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()),
            " level=", LogLevelName(level), " event=", Quoted(event))) {}
  ~LogLine() {
    line_.push_back('\n');
    sink_.Write(line_);
  }
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  // Appends " key=value"; `value` is anything absl::StrCat takes.
  LogLine& Add(absl::string_view key, const absl::AlphaNum& value) {
    absl::StrAppend(&line_, " ", key, "=", Quoted(value.Piece()));
    return *this;
  }

  // `value` as it appears in a line.
  static std::string Quoted(absl::string_view value) {
    bool plain = !value.empty();
    for (char c : value) plain = plain && Plain(c);
    if (plain) return std::string(value);
    std::string out = "\"";
    for (char c : value) {
      switch (c) {
        case '"':
        case '\\':
          out.push_back('\\');
          out.push_back(c);
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c >= ' ' && c < '\x7f') {
            out.push_back(c);
          } else {
            absl::StrAppendFormat(&out, "\\x%02x",
                                  static_cast<unsigned char>(c));
          }
      }
    }
    out.push_back('"');
    return out;
  }

 private:
  static bool Plain(char c) {
    return c > ' ' && c < '\x7f' && c != '"' && c != '=' && c != '\\';
  }

  LogSink& sink_;
  std::string line_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_LOG_H_
