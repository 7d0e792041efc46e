// syncnorm-aggregator: parses flags into ServerOptions, serves until SIGTERM
// or SIGINT, then shuts down gracefully.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/server.h"
#include "server/server_options.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "HOST:PORT to serve on; port 0 picks a free port");
ABSL_FLAG(int64_t, round_timeout_ms, 30000,
          "How long a round waits for missing ranks when its job sets none");
ABSL_FLAG(std::string, data_dir, "./syncnorm-data",
          "Folder of the state store (accepted; used once the store exists)");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (atomically) once serving");

namespace {

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
    server.Shutdown(absl::Seconds(5));
  });
  server.Wait();
  stopper.join();
  return 0;
}
