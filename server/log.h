// Structured log lines of the aggregator's events, one per line on stderr:
//   syncnorm event=job_created job=resnet50-run7 world_size=8 layers=53
// (the format of LoggingRoundObserver's round lines), so that a log
// pipeline can parse them as key=value pairs. Values that are empty or hold
// a space, quote, '=' or a control character are double-quoted with C
// escapes. Callers log names, counts and codes; never secrets (tokens, keys,
// payloads).
#ifndef SYNCNORM_SERVER_LOG_H_
#define SYNCNORM_SERVER_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace syncnorm {

// Builds one line and writes it, with a single call, when destroyed:
//   LogLine("checkpoint").Add("job", id).Add("step", step);
// Thread-compatible; lines of concurrent LogLines do not interleave.
class LogLine {
 public:
  explicit LogLine(absl::string_view event)
      : line_(absl::StrCat("syncnorm event=", event)) {}
  ~LogLine() {
    line_.push_back('\n');
    std::fwrite(line_.data(), 1, line_.size(), stderr);
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
    for (char c : value) {
      plain = plain && c > ' ' && c != '"' && c != '=' && c != '\x7f';
    }
    if (plain) return std::string(value);
    return absl::StrCat("\"", absl::CEscape(value), "\"");
  }

 private:
  std::string line_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_LOG_H_
