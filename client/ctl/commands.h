// The subcommands of syncnormctl, each a function of the parsed command
// line that prints its result and returns a status (main maps it to an exit
// code).
#ifndef SYNCNORM_CLIENT_CTL_COMMANDS_H_
#define SYNCNORM_CLIENT_CTL_COMMANDS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"

namespace syncnorm::ctl {

// A parsed command line: the command, its positional arguments and the
// --name=value options.
struct Args {
  std::string command;
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;

  // INVALID_ARGUMENT (a usage error) when the option is not an integer.
  absl::StatusOr<std::optional<int64_t>> Int(const std::string& name) const;
};

// A usage error: main prints the usage and exits 2.
absl::Status Usage(absl::string_view what);

// Runs args.command against `client`, printing to `out`. A usage error for
// an unknown command or wrong arguments; otherwise the server's or the
// input file's status.
absl::Status Run(Client& client, const Args& args, std::ostream& out);

// The text `syncnormctl --help` prints.
std::string UsageText();

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_COMMANDS_H_
