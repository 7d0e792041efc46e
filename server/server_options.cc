#include "server/server_options.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/domain/job_spec.h"
#include "server/rpc/auth.h"
#include "server/rpc/tls.h"

namespace syncnorm {
namespace {

TlsFiles TlsFilesOf(const ServerOptions& options) {
  return TlsFiles{options.tls_cert, options.tls_key, options.tls_client_ca};
}

// Whether `address` is HOST:PORT with a port in 0..65535.
bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  return colon != std::string::npos && colon != 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port >= 0 &&
         port <= 65535;
}

// OK when `dir` is a writable folder, or does not exist yet and its nearest
// existing ancestor is one (so the server can create it), or is empty (state
// in memory, or no backups). `flag` names it in errors.
absl::Status CheckWritableDir(const std::string& dir, const char* flag) {
  if (dir.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(dir, error);
  while (!std::filesystem::exists(path, error) && path.has_relative_path()) {
    path = path.parent_path();
  }
  if (!std::filesystem::is_directory(path, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, "='", dir, "': ", path.string(), " is not a folder"));
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--", flag, "='", dir, "': ", path.string(),
                     " is not writable by this user"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckServerOptions(const ServerOptions& options) {
  if (options.round_timeout <= absl::ZeroDuration() ||
      options.round_timeout > kMaxRoundTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--round_timeout_ms must be positive and at most ",
        absl::ToInt64Milliseconds(kMaxRoundTimeout), " (24 hours)"));
  }
  if (options.reaper_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("reaper_period must be positive");
  }
  if (options.round_log_mib < 1 || options.round_log_mib > kMaxRoundLogMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--round_log_mib must be between 1 and ", kMaxRoundLogMib,
                     " (the round log's size in MiB; default ",
                     kDefaultRoundLogMib, "); got ", options.round_log_mib));
  }
  if (options.keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        "--keep_checkpoints must be >= 0 (0 keeps all)");
  }
  if (options.straggler_threshold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--straggler_threshold_ms must be >= 0");
  }
  if (options.log_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--log_interval_ms must be >= 0");
  }
  if (absl::Status s =
          CheckTransportBytes(options.max_transport_bytes, options.limits);
      !s.ok()) {
    return s;
  }
  return CheckTransportSecurity(options.listen, TlsFilesOf(options),
                                options.allow_insecure);
}

absl::Status CheckServerPlaces(const ServerOptions& options) {
  if (!IsHostPort(options.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen='", options.listen,
                     "' is not HOST:PORT with a port in 0..65535"));
  }
  if (!options.metrics_listen.empty() && !IsHostPort(options.metrics_listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen='", options.metrics_listen,
                     "' is not HOST:PORT with a port in 0..65535 (or empty)"));
  }
  if (absl::Status s = CheckWritableDir(options.data_dir, "data_dir");
      !s.ok()) {
    return s;
  }
  return CheckWritableDir(options.backup_dir, "backup_dir");
}

absl::Status CheckServerFiles(const ServerOptions& options) {
  if (absl::Status s = MakeServerCredentials(TlsFilesOf(options)).status();
      !s.ok()) {
    return s;
  }
  if (options.tokens_file.empty()) return absl::OkStatus();
  return Authenticator::Open(options.tokens_file, absl::ZeroDuration())
      .status();
}

}  // namespace syncnorm
