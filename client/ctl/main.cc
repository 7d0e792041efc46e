// syncnormctl: the admin CLI of the syncnorm aggregator. See UsageText()
// in commands.cc, or `syncnormctl --help`.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
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
    static const char* const kKnown[] = {
        "server", "timeout", "group",    "step",     "tag",        "out",
        "help",   "tls",     "tls_ca",   "tls_cert", "tls_key",    "token_file"};
    if (std::find(std::begin(kKnown), std::end(kKnown), name) ==
        std::end(kKnown)) {
      return syncnorm::ctl::Usage(absl::StrCat("unknown option '", a, "'"));
    }
    if (eq == std::string::npos && name != "help" && name != "tls") {
      return syncnorm::ctl::Usage(absl::StrCat("give --", name, "=VALUE"));
    }
    args.options[name] = eq == std::string::npos ? "" : a.substr(eq + 1);
  }
  return absl::OkStatus();
}

// --tls, --tls_ca, --tls_cert, --tls_key and --token_file into `options`
// (files read here, so a bad path is a usage error naming it).
absl::Status Credentials(const syncnorm::ctl::Args& args,
                         syncnorm::ClientOptions& options) {
  auto file = [&](const char* name, std::string& into) -> absl::Status {
    auto it = args.options.find(name);
    if (it == args.options.end()) return absl::OkStatus();
    absl::StatusOr<std::string> text = syncnorm::ReadPemFile(it->second);
    if (!text.ok()) {
      return syncnorm::ctl::Usage(
          absl::StrCat("--", name, ": ", text.status().message()));
    }
    into = *std::move(text);
    return absl::OkStatus();
  };
  options.tls = args.options.count("tls") > 0;
  for (const auto& [name, into] :
       {std::pair<const char*, std::string*>{"tls_ca", &options.tls_root_ca},
        {"tls_cert", &options.tls_client_cert},
        {"tls_key", &options.tls_client_key},
        {"token_file", &options.token}}) {
    if (absl::Status s = file(name, *into); !s.ok()) return s;
  }
  if (options.tls_client_cert.empty() != options.tls_client_key.empty()) {
    return syncnorm::ctl::Usage("--tls_cert and --tls_key go together");
  }
  // A token file may end with a newline (or other white space).
  options.token = std::string(absl::StripAsciiWhitespace(options.token));
  if (args.options.count("token_file") > 0 && options.token.empty()) {
    return syncnorm::ctl::Usage(absl::StrCat(
        "--token_file=", args.options.at("token_file"), " is empty"));
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
  if (parsed.ok()) parsed = Credentials(args, options);
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
