// The subcommands of syncnormctl, each a function of the parsed command
// line that prints its result and returns a status (main maps it to an exit
// code).
#ifndef SYNCNORM_CLIENT_CTL_COMMANDS_H_
#define SYNCNORM_CLIENT_CTL_COMMANDS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/ctl/args.h"

namespace syncnorm::ctl {

// Runs args.command against `client`, printing to `out` (a table, or JSON
// with -o json). A usage error for an unknown command or wrong arguments;
// otherwise the server's or the input file's status.
absl::Status Run(Client& client, const Args& args, std::ostream& out);

// The text `syncnormctl --help` prints.
std::string UsageText();

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_COMMANDS_H_
