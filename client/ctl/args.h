// syncnormctl's command line: a command, its positional arguments, and
// options, each written `--name=value` or `--name value` (`-o json`, `-h`).
#ifndef SYNCNORM_CLIENT_CTL_ARGS_H_
#define SYNCNORM_CLIENT_CTL_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace syncnorm::ctl {

// A parsed command line.
struct Args {
  // The first positional argument ("jobs", "help", ...); empty if none.
  std::string command;
  std::vector<std::string> positional;
  // By long name ("-o" is "output", "-h" is "help"); a switch (--tls,
  // --replace, --help, --version) maps to "".
  std::map<std::string, std::string> options;

  bool Has(const std::string& name) const { return options.count(name) > 0; }
  // The option's value, or `fallback` when it is not given.
  std::string Get(const std::string& name,
                  const std::string& fallback = "") const;
  // A usage error when the option is not an integer.
  absl::StatusOr<std::optional<int64_t>> Int(const std::string& name) const;
  // true for `-o json` / `--output=json`; a usage error for a format other
  // than json or table.
  absl::StatusOr<bool> Json() const;
};

// Parses argv[1..argc-1]. A usage error (see Usage) for an unknown option,
// an option without its value (the next word is taken unless it is an
// option itself), or a value given to a switch other than true/false.
// `--` ends the options.
absl::StatusOr<Args> ParseArgs(int argc, const char* const* argv);

// A usage error "usage: syncnormctl COMMAND SHAPE" unless `args` has
// between `min` and `max` positional arguments after its command.
absl::Status ExpectPositional(const Args& args, size_t min, size_t max,
                              absl::string_view shape);

// The ranks of positional arguments [first, end): each an integer >= 0,
// none twice; a usage error naming the first that is not.
absl::StatusOr<std::vector<int>> ParseRanks(const Args& args, size_t first);

// A usage error: syncnormctl prints the usage and exits 2.
absl::Status Usage(absl::string_view what);
bool IsUsage(const absl::Status& status);

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_ARGS_H_
