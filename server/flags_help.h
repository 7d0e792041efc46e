// The command line's --help and --version texts of syncnorm's binaries.
#ifndef SYNCNORM_SERVER_FLAGS_HELP_H_
#define SYNCNORM_SERVER_FLAGS_HELP_H_

#include <string>

#include "absl/strings/string_view.h"

namespace syncnorm {

// Whether the arguments ask for help: -h, -help or --help anywhere before a
// "--" (Abseil's own --help exits 1 and lists only the flags of files named
// after the program).
bool AsksForHelp(int argc, const char* const* argv);

// `usage`, then every flag linked into the program except Abseil's built-in
// ones (--flagfile is named at the end), sorted by name, each as
// "--name=default" and its help wrapped to 80 columns.
std::string FlagsHelp(absl::string_view usage);

// "<program> <version>\n", plus a line saying so in a build without NDEBUG
// (assertions on: not a release build).
std::string VersionText(absl::string_view program);

// A binary's command line: sets its usage message and `program`'s
// --version text, then prints FlagsHelp(usage) and returns false when the
// arguments ask for help (the binary exits 0), and otherwise parses the
// flags (Abseil exits on a bad one) and returns true.
bool ParseFlagsOrPrintHelp(int argc, char** argv, absl::string_view usage,
                           absl::string_view program);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_FLAGS_HELP_H_
