#include "server/flags_help.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "syncnorm_version.h"

namespace syncnorm {
namespace {

constexpr int kWidth = 80;
constexpr absl::string_view kIndent = "      ";

// `text` as lines of at most kWidth columns (longer words stay whole), each
// starting with kIndent.
std::string Wrapped(absl::string_view text) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? kIndent : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, line, "\n");
  return out;
}

}  // namespace

bool AsksForHelp(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "-h" || arg == "-help" || arg == "--help") return true;
  }
  return false;
}

std::string FlagsHelp(absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // Abseil's own (--flagfile, --fromenv, --helpfull, --version, ...).
    if (absl::StrContains(flag->Filename(), "absl/flags/")) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string out = absl::StrCat(
      usage,
      "\n\nFlags (--name=value or --name value; a bool flag alone is "
      "true):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&out, "  --", flag->Name(), "=", flag->DefaultValue(), "\n",
                    Wrapped(flag->Help()));
  }
  absl::StrAppend(&out, "  --flagfile=FILE\n",
                  Wrapped("More flags from FILE, one per line"), "  --help\n",
                  Wrapped("This text"), "  --version\n",
                  Wrapped("The version, and whether this is a release build"));
  return out;
}

std::string VersionText(absl::string_view program) {
  std::string out = absl::StrCat(program, " ", kSyncnormVersion, "\n");
#ifndef NDEBUG
  absl::StrAppend(
      &out,
      "development build: assertions on (release builds define "
      "NDEBUG: scripts/build-release.sh, bazel --config=release)\n");
#endif
  return out;
}

bool ParseFlagsOrPrintHelp(int argc, char** argv, absl::string_view usage,
                           absl::string_view program) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.version_string = [name = std::string(program)] {
    return VersionText(name);
  };
  absl::SetFlagsUsageConfig(config);
  if (AsksForHelp(argc, argv)) {
    std::fputs(FlagsHelp(usage).c_str(), stdout);
    return false;
  }
  absl::ParseCommandLine(argc, argv);
  return true;
}

}  // namespace syncnorm
