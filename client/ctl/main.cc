// syncnormctl: the admin CLI of the syncnorm aggregator. See UsageText()
// in commands.cc, or `syncnormctl --help`.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/commands.h"

namespace {

enum ExitCode {
  kOk = 0,
  kOther = 1,
  kUsage = 2,
  kUnreachable = 3,
  kNotFound = 4,
  kInvalid = 5,
};

int ExitCodeOf(const absl::Status& s) {
  if (s.ok()) return kOk;
  if (s.GetPayload("syncnormctl/usage").has_value()) return kUsage;
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kUnreachable;
    case absl::StatusCode::kNotFound:
      return kNotFound;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      return kInvalid;
    default:
      return kOther;
  }
}

// --name=value options anywhere; everything else is positional.
absl::Status Parse(int argc, char** argv, syncnorm::ctl::Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!absl::StartsWith(a, "--")) {
      if (args.command.empty()) {
        args.command = a;
      } else {
        args.positional.push_back(a);
      }
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? a.npos : eq - 2);
    if (name != "server" && name != "timeout" && name != "group" &&
        name != "step" && name != "tag" && name != "out" && name != "help") {
      return syncnorm::ctl::Usage(absl::StrCat("unknown option '", a, "'"));
    }
    if (eq == std::string::npos && name != "help") {
      return syncnorm::ctl::Usage(absl::StrCat("give --", name, "=VALUE"));
    }
    args.options[name] = eq == std::string::npos ? "" : a.substr(eq + 1);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  syncnorm::ctl::Args args;
  absl::Status parsed = Parse(argc, argv, args);
  if (parsed.ok() && args.options.count("help") > 0) {
    std::cout << syncnorm::ctl::UsageText();
    return kOk;
  }
  syncnorm::ClientOptions options;
  if (auto it = args.options.find("server"); it != args.options.end()) {
    options.address = it->second;
  }
  options.rpc_timeout = absl::Seconds(10);
  if (auto it = args.options.find("timeout");
      parsed.ok() && it != args.options.end() &&
      !absl::ParseDuration(it->second, &options.rpc_timeout)) {
    parsed = syncnorm::ctl::Usage(absl::StrCat(
        "--timeout=", it->second, " is not a duration (say 10s or 500ms)"));
  }
  absl::Status status = parsed;
  if (status.ok()) {
    syncnorm::Client client(options);
    status = syncnorm::ctl::Run(client, args, std::cout);
  }
  if (status.ok()) return kOk;
  const int code = ExitCodeOf(status);
  std::fprintf(stderr, "syncnormctl: %s\n", std::string(status.message()).c_str());
  if (code == kUsage) {
    std::fprintf(stderr, "\n%s", syncnorm::ctl::UsageText().c_str());
  } else if (code == kUnreachable) {
    std::fprintf(stderr,
                 "syncnormctl: (%s) is the aggregator running at %s? "
                 "--server picks another address\n",
                 absl::StatusCodeToString(status.code()).c_str(),
                 options.address.c_str());
  }
  return code;
}
