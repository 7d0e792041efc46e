// syncnorm-aggregator: parses flags into ServerOptions, serves until SIGTERM
// or SIGINT, then shuts down gracefully.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/server.h"
#include "server/server_options.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "HOST:PORT to serve on; port 0 picks a free port");
ABSL_FLAG(int64_t, round_timeout_ms, 30000,
          "How long a round waits for missing ranks when its job sets none");
ABSL_FLAG(std::string, data_dir, "./syncnorm-data",
          "Folder of the state store (RocksDB): jobs, running statistics, "
          "checkpoints; created if missing. Empty: in memory, not durable");
ABSL_FLAG(bool, sync_writes, false,
          "fsync every update, so acknowledged updates also survive a "
          "machine crash (a killed process loses nothing either way)");
ABSL_FLAG(int, keep_checkpoints, 5,
          "Untagged checkpoints kept per job (newest); tagged ones are "
          "always kept; 0 keeps all");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (atomically) once serving");
ABSL_FLAG(bool, check_config, false,
          "Check the flags (--flagfile included) and exit without serving: "
          "0 when the server could start with them, 2 and the reason if not");

namespace {

// How long calls in flight get after SIGTERM before they are cancelled.
// deploy/'s terminationGracePeriodSeconds is sized from it.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

// OK when `dir` is a writable folder, or does not exist yet and its nearest
// existing ancestor is one (so the server can create it), or is empty (state
// in memory).
absl::Status CheckDataDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(dir, error);
  while (!std::filesystem::exists(path, error) && path.has_relative_path()) {
    path = path.parent_path();
  }
  if (!std::filesystem::is_directory(path, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_dir='", dir, "': ", path.string(), " is not a folder"));
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--data_dir='", dir, "': ", path.string(),
                     " is not writable by this user"));
  }
  return absl::OkStatus();
}

// What --check_config checks: everything Server::Start() would reject,
// short of binding the port.
absl::Status CheckOptions(const syncnorm::ServerOptions& options) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen='", options.listen,
                     "' is not HOST:PORT with a port in 0..65535"));
  }
  if (options.round_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--round_timeout_ms must be positive");
  }
  if (options.keep_checkpoints < 0) {
    return absl::InvalidArgumentError("--keep_checkpoints must be >= 0");
  }
  return CheckDataDir(options.data_dir);
}

// Writes `port` to `path` through a temporary file and a rename, so a reader
// never sees a partial number.
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return colon == std::string::npos ? listen : listen.substr(0, colon);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread (gRPC's included, which inherit
  // the mask); a dedicated thread takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  syncnorm::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.round_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_round_timeout_ms));
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.sync_writes = absl::GetFlag(FLAGS_sync_writes);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (options.data_dir.empty()) {
    std::fprintf(stderr,
                 "syncnorm-aggregator: warning: --data_dir is empty; state "
                 "is kept in memory and lost on exit\n");
  }

  if (absl::GetFlag(FLAGS_check_config)) {
    const absl::Status checked = CheckOptions(options);
    if (!checked.ok()) {
      std::fprintf(stderr, "syncnorm-aggregator: bad config: %s\n",
                   checked.ToString().c_str());
      return 2;
    }
    std::printf(
        "syncnorm-aggregator: config ok: listen=%s round_timeout_ms=%lld "
        "data_dir=%s sync_writes=%d keep_checkpoints=%d "
        "shutdown_grace_ms=%lld\n",
        options.listen.c_str(),
        static_cast<long long>(
            absl::ToInt64Milliseconds(options.round_timeout)),
        options.data_dir.c_str(), options.sync_writes ? 1 : 0,
        options.keep_checkpoints,
        static_cast<long long>(absl::ToInt64Milliseconds(kShutdownGrace)));
    return 0;
  }

  syncnorm::Server server(options);
  absl::Status started = server.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "syncnorm-aggregator: %s\n",
                 started.ToString().c_str());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    absl::Status written = WritePortFile(port_file, server.bound_port());
    if (!written.ok()) {
      std::fprintf(stderr, "syncnorm-aggregator: %s\n",
                   written.ToString().c_str());
      server.Shutdown(absl::ZeroDuration());
      server.Wait();
      return 1;
    }
  }
  std::fprintf(stderr, "syncnorm-aggregator listening on %s:%d\n",
               HostOf(options.listen).c_str(), server.bound_port());

  std::thread stopper([&server, &stop_signals] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "syncnorm-aggregator: signal %d, shutting down\n",
                 signal);
    server.Shutdown(kShutdownGrace);
  });
  server.Wait();
  stopper.join();
  return 0;
}
