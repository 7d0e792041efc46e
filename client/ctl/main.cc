// syncnormctl: the admin CLI of the syncnorm aggregator. See UsageText()
// in commands.cc, or `syncnormctl --help`.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/args.h"
#include "client/ctl/commands.h"
#include "syncnorm_version.h"

namespace {

enum ExitCode {
  kOk = 0,
  kOther = 1,
  kUsage = 2,
  kUnreachable = 3,
  kNotFound = 4,
  kInvalid = 5,
};

constexpr char kDefaultAddress[] = "127.0.0.1:50051";
constexpr char kAddressVariable[] = "SYNCNORM_ADDRESS";

int ExitCodeOf(const absl::Status& s) {
  if (s.ok()) return kOk;
  if (syncnorm::ctl::IsUsage(s)) return kUsage;
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

// --tls, --tls_ca, --tls_cert, --tls_key and --token_file into `options`
// (files read here, so a bad path is a usage error naming it).
absl::Status Credentials(const syncnorm::ctl::Args& args,
                         syncnorm::ClientOptions& options) {
  auto file = [&](const char* name, std::string& into) -> absl::Status {
    if (!args.Has(name)) return absl::OkStatus();
    absl::StatusOr<std::string> text = syncnorm::ReadPemFile(args.Get(name));
    if (!text.ok()) {
      return syncnorm::ctl::Usage(
          absl::StrCat("--", name, ": ", text.status().message()));
    }
    into = *std::move(text);
    return absl::OkStatus();
  };
  options.tls = args.Has("tls");
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
  if (args.Has("token_file") && options.token.empty()) {
    return syncnorm::ctl::Usage(
        absl::StrCat("--token_file=", args.Get("token_file"), " is empty"));
  }
  return absl::OkStatus();
}

// The client's options from the command line; the server from --server,
// else $SYNCNORM_ADDRESS, else the default (`source` says which).
absl::StatusOr<syncnorm::ClientOptions> ClientOptionsOf(
    const syncnorm::ctl::Args& args, std::string& source) {
  syncnorm::ClientOptions options;
  const char* env = std::getenv(kAddressVariable);
  if (args.Has("server")) {
    options.address = args.Get("server");
    source = "--server";
  } else if (env != nullptr && *env != '\0') {
    options.address = env;
    source = kAddressVariable;
  } else {
    options.address = kDefaultAddress;
    source = "the default";
  }
  options.rpc_timeout = absl::Seconds(10);
  if (args.Has("timeout") &&
      !absl::ParseDuration(args.Get("timeout"), &options.rpc_timeout)) {
    return syncnorm::ctl::Usage(absl::StrCat("--timeout=", args.Get("timeout"),
                                             " is not a duration (say 10s or "
                                             "500ms)"));
  }
  if (absl::Status s = Credentials(args, options); !s.ok()) return s;
  return options;
}

void PrintHint(const absl::Status& status, const std::string& address,
               const std::string& source) {
  if (status.code() == absl::StatusCode::kUnavailable) {
    std::fprintf(stderr,
                 "syncnormctl: is the aggregator running at %s (from %s)? "
                 "--server or $%s picks another address\n",
                 address.c_str(), source.c_str(), kAddressVariable);
  } else if (status.code() == absl::StatusCode::kUnimplemented) {
    std::fprintf(stderr,
                 "syncnormctl: the aggregator at %s does not know this call: "
                 "it runs an older syncnorm than this syncnormctl (%s); "
                 "upgrade the aggregator\n",
                 address.c_str(), syncnorm::kSyncnormVersion);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<syncnorm::ctl::Args> args =
      syncnorm::ctl::ParseArgs(argc, argv);
  if (args.ok() && (args->Has("help") || args->command == "help")) {
    std::cout << syncnorm::ctl::UsageText();
    return kOk;
  }
  if (args.ok() && args->Has("version")) {
    std::cout << "syncnormctl " << syncnorm::kSyncnormVersion << "\n";
    return kOk;
  }
  std::string source;
  absl::StatusOr<syncnorm::ClientOptions> options =
      args.ok() ? ClientOptionsOf(*args, source)
                : absl::StatusOr<syncnorm::ClientOptions>(args.status());
  absl::Status status = options.status();
  if (status.ok()) {
    syncnorm::Client client(*options);
    status = syncnorm::ctl::Run(client, *args, std::cout);
  }
  if (status.ok()) return kOk;
  const int code = ExitCodeOf(status);
  std::fprintf(stderr, "syncnormctl: %s\n",
               std::string(status.message()).c_str());
  if (code == kUsage) {
    std::fprintf(stderr, "\n%s", syncnorm::ctl::UsageText().c_str());
  } else if (options.ok()) {
    PrintHint(status, options->address, source);
  }
  return code;
}
