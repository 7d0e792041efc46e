// syncnorm-aggregator: parses flags into ServerOptions, serves until SIGTERM
// or SIGINT, then shuts down gracefully.
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/support/log.h"
#include "server/domain/log.h"
#include "server/flags_help.h"
#include "server/process.h"
#include "server/server.h"
#include "server/server_options.h"
#include "server/store/rocksdb_engine.h"

namespace {

// The defaults of the flags: ServerOptions' own, so that each is written
// once (server_options.h).
const syncnorm::ServerOptions& Defaults() {
  static const auto* const kDefaults = new syncnorm::ServerOptions();
  return *kDefaults;
}

int64_t Ms(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// The exit code of a start refused because the data_dir's state is
// damaged (DATA_LOSS): the round log, RocksDB's files, a record that does
// not decode. Other failed starts exit 1, a bad config 2.
constexpr int kExitDataLoss = 3;

}  // namespace

ABSL_FLAG(std::string, listen, Defaults().listen,
          "HOST:PORT to serve on; port 0 picks a free port");
ABSL_FLAG(int64_t, round_timeout_ms, Ms(Defaults().round_timeout),
          "How long a round waits for missing ranks when its job sets none");
ABSL_FLAG(std::string, data_dir, Defaults().data_dir,
          "Folder of the state store (RocksDB): jobs, running statistics, "
          "checkpoints; created if missing. Empty: in memory, not durable");
ABSL_FLAG(std::string, backup_dir, Defaults().backup_dir,
          "Folder for backups (Backup, RestoreBackup), on another volume "
          "than --data_dir's; created if missing. Empty: no backups");
ABSL_FLAG(bool, sync_writes, Defaults().sync_writes,
          "fsync every update, so acknowledged updates also survive a "
          "machine crash (a killed process loses nothing either way)");
ABSL_FLAG(int, round_log_mib, Defaults().round_log_mib,
          "Size of the round log in MiB (1 to 4096), resident in memory: "
          "best 16 steps of the shard's records, about 768 bytes per "
          "channel, so that rounds' retry records never reach RocksDB");
ABSL_FLAG(std::string, round_log_recovery, "tolerate_torn_tail",
          "A damaged round log at start: tolerate_torn_tail (drop a torn "
          "last record, refuse to start on other damage, exit code 3) or "
          "point_in_time (replay up to the damage, accept losing the rest)");
ABSL_FLAG(int, keep_checkpoints, Defaults().keep_checkpoints,
          "Untagged checkpoints kept per job (newest); tagged ones are "
          "always kept; 0 keeps all");
ABSL_FLAG(int64_t, straggler_threshold_ms, Ms(Defaults().straggler_threshold),
          "A contributor that arrives more than this after its round's "
          "first one is a straggler (event=straggler log line, "
          "syncnorm_stragglers_total)");
ABSL_FLAG(int64_t, log_interval_ms, Ms(Defaults().log_interval),
          "A job's straggler and quorum rounds after the first of an interval "
          "are counted into one log line at its end; 0: a line per round");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (atomically) once serving");
ABSL_FLAG(std::string, metrics_listen, Defaults().metrics_listen,
          "HOST:PORT of the Prometheus endpoint (HTTP GET /metrics); port 0 "
          "picks a free one (logged in the start line). Empty: no metrics");
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000,
          "After SIGTERM: how long rounds in flight get to finish (new "
          "rounds are refused) before the rest is cancelled and the state "
          "store closed");

// Security.
ABSL_FLAG(std::string, tls_cert, Defaults().tls_cert,
          "Server certificate chain (PEM); with --tls_key, serve TLS");
ABSL_FLAG(std::string, tls_key, Defaults().tls_key,
          "Private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_client_ca, Defaults().tls_client_ca,
          "CA (PEM) that signs client certificates: mutual TLS, clients "
          "without a certificate it verifies are refused");
ABSL_FLAG(bool, allow_insecure, Defaults().allow_insecure,
          "Serve plaintext on a non-loopback --listen (without it, a "
          "non-loopback address needs --tls_cert/--tls_key)");
ABSL_FLAG(std::string, tokens_file, Defaults().tokens_file,
          "Bearer tokens, one per line '<token> <scope>[,<scope>...]' with "
          "scopes 'admin' or 'job:<id>'; re-read when it changes. Empty: no "
          "authentication");

// Limits: exceeding one is RESOURCE_EXHAUSTED naming it; <= 0: no limit.
ABSL_FLAG(int64_t, max_message_bytes, Defaults().limits.max_message_bytes,
          "Largest request message (serialized), in bytes; gRPC's transport "
          "cuts off messages over twice this with its own error");
ABSL_FLAG(int, max_jobs, Defaults().limits.max_jobs, "Jobs on this server");
ABSL_FLAG(int, max_layers_per_job, Defaults().limits.max_layers_per_job,
          "Layers of one job");
ABSL_FLAG(int, max_channels, Defaults().limits.max_channels,
          "Channels (num_features) of one layer");
ABSL_FLAG(int, max_world_size, Defaults().limits.max_world_size,
          "Contributors (world_size) of one job");
ABSL_FLAG(int64_t, max_channels_per_job, Defaults().limits.max_channels_per_job,
          "Channels of one job: num_features summed over its layers, times "
          "its groups (each keeps its own running statistics)");
ABSL_FLAG(int, max_pending_rounds, Defaults().limits.max_pending_rounds,
          "Rounds in flight (waiting for ranks) across the server");
ABSL_FLAG(int, max_streams, Defaults().limits.max_streams,
          "Open Reduce streams");
ABSL_FLAG(int, max_streams_per_connection,
          Defaults().max_streams_per_connection,
          "HTTP/2 streams (calls) one connection may have open at once, as "
          "advertised to clients (gRPC clients queue calls beyond it)");
ABSL_FLAG(int64_t, stream_idle_timeout_ms, Ms(Defaults().stream_idle_timeout),
          "A Reduce stream idle this long (nothing read, answered or "
          "written) ends UNAVAILABLE, freeing its --max_streams slot; "
          "clients reopen on next use. <= 0: never");
ABSL_FLAG(int, max_waiting_calls, Defaults().limits.max_waiting_calls,
          "ReduceOnce and Checkpoint calls in progress (each may wait for "
          "its round or its step, holding its request)");
// Enforced by gRPC, with its own error; <= 0: no quota.
ABSL_FLAG(int64_t, max_transport_bytes, Defaults().max_transport_bytes,
          "Memory gRPC's transport may hold, in bytes: messages still "
          "arriving (gRPC takes a whole message before its size check), "
          "every stream's unread data, read buffers. Past it gRPC cancels "
          "streams, its oldest connections' first, with its own "
          "RESOURCE_EXHAUSTED ('Received RST_STREAM with error code 11', "
          "naming no flag). At least twice --max_message_bytes. The "
          "default holds 8 messages at that ceiling (default "
          "--max_message_bytes), or 1000 of the largest contributions "
          "--max_channels allows (1 MiB), arriving at once; not an 8 MiB "
          "HTTP/2 window for each of --max_streams");

ABSL_FLAG(bool, check_config, false,
          "Check the flags (--flagfile included) and exit without serving: "
          "0 when the server could start with them, 2 and the reason if not");

namespace {

constexpr char kUsage[] =
    "Usage: syncnorm-aggregator [--flag=value ...]\n"
    "Serves syncnorm's aggregator (synchronized batch normalization) over "
    "gRPC until\nSIGTERM or SIGINT. See docs/operations.md, "
    "\"The aggregator\".";

// --round_log_recovery names one of two modes.
absl::Status CheckRecoveryFlag() {
  const std::string mode = absl::GetFlag(FLAGS_round_log_recovery);
  if (mode == "tolerate_torn_tail" || mode == "point_in_time") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--round_log_recovery must be tolerate_torn_tail (the default) or "
      "point_in_time; got '",
      mode, "'"));
}

// The options the flags say: the one place they are read.
syncnorm::ServerOptions OptionsFromFlags() {
  syncnorm::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.round_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_round_timeout_ms));
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.backup_dir = absl::GetFlag(FLAGS_backup_dir);
  options.sync_writes = absl::GetFlag(FLAGS_sync_writes);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.round_log_mib = absl::GetFlag(FLAGS_round_log_mib);
  // CheckRecoveryFlag has refused any other value.
  options.round_log_recovery =
      absl::GetFlag(FLAGS_round_log_recovery) == "point_in_time"
          ? syncnorm::RingLogRecovery::kPointInTime
          : syncnorm::RingLogRecovery::kTolerateTornTail;
  options.straggler_threshold =
      absl::Milliseconds(absl::GetFlag(FLAGS_straggler_threshold_ms));
  options.log_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_log_interval_ms));
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.limits.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.limits.max_layers_per_job = absl::GetFlag(FLAGS_max_layers_per_job);
  options.limits.max_channels = absl::GetFlag(FLAGS_max_channels);
  options.limits.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  options.limits.max_channels_per_job =
      absl::GetFlag(FLAGS_max_channels_per_job);
  options.limits.max_pending_rounds = absl::GetFlag(FLAGS_max_pending_rounds);
  options.limits.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.limits.max_waiting_calls = absl::GetFlag(FLAGS_max_waiting_calls);
  options.stream_idle_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_stream_idle_timeout_ms));
  options.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  options.max_transport_bytes = absl::GetFlag(FLAGS_max_transport_bytes);
  return options;
}

// What --check_config checks: everything Server::Start() would reject,
// short of binding the ports. Where it would listen and keep its state
// first, then the options themselves (Start's own check), then the files
// they name.
absl::Status CheckConfig(const syncnorm::ServerOptions& options) {
  if (absl::Status s = syncnorm::CheckServerPlaces(options); !s.ok()) {
    return s;
  }
  if (absl::Status s = syncnorm::CheckServerOptions(options); !s.ok()) {
    return s;
  }
  return syncnorm::CheckServerFiles(options);
}

// The line --check_config prints for a config that passes: the settings as
// flag=value, so that a deployment can compare them with what it meant.
void PrintConfig(const syncnorm::ServerOptions& options,
                 absl::Duration shutdown_grace) {
  std::printf(
      "syncnorm-aggregator: config ok: listen=%s round_timeout_ms=%lld "
      "data_dir=%s backup_dir=%s sync_writes=%d round_log_mib=%d "
      "round_log_recovery=%s "
      "keep_checkpoints=%d "
      "straggler_threshold_ms=%lld log_interval_ms=%lld "
      "shutdown_grace_ms=%lld tls=%s tokens_file=%s allow_insecure=%d "
      "max_message_bytes=%lld max_jobs=%d max_layers_per_job=%d "
      "max_channels=%d max_world_size=%d max_channels_per_job=%lld "
      "max_pending_rounds=%d max_streams=%d max_waiting_calls=%d "
      "max_transport_bytes=%lld stream_idle_timeout_ms=%lld "
      "max_streams_per_connection=%d\n",
      options.listen.c_str(), static_cast<long long>(Ms(options.round_timeout)),
      options.data_dir.c_str(),
      options.backup_dir.empty() ? "-" : options.backup_dir.c_str(),
      options.sync_writes ? 1 : 0, options.round_log_mib,
      options.round_log_recovery == syncnorm::RingLogRecovery::kPointInTime
          ? "point_in_time"
          : "tolerate_torn_tail",
      options.keep_checkpoints,
      static_cast<long long>(Ms(options.straggler_threshold)),
      static_cast<long long>(Ms(options.log_interval)),
      static_cast<long long>(Ms(shutdown_grace)),
      options.tls_cert.empty()        ? "off"
      : options.tls_client_ca.empty() ? "on"
                                      : "mutual",
      options.tokens_file.empty() ? "-" : options.tokens_file.c_str(),
      options.allow_insecure ? 1 : 0,
      static_cast<long long>(options.limits.max_message_bytes),
      options.limits.max_jobs, options.limits.max_layers_per_job,
      options.limits.max_channels, options.limits.max_world_size,
      static_cast<long long>(options.limits.max_channels_per_job),
      options.limits.max_pending_rounds, options.limits.max_streams,
      options.limits.max_waiting_calls,
      static_cast<long long>(options.max_transport_bytes),
      static_cast<long long>(Ms(options.stream_idle_timeout)),
      options.max_streams_per_connection);
}

// gRPC's own log lines (its errors; more under GRPC_VERBOSITY and
// GRPC_TRACE) in the aggregator's format. A message is cut where it names
// authorization metadata: gRPC's traces can print headers, and a bearer
// token is a secret.
void LogGrpc(gpr_log_func_args* args) {
  constexpr size_t kMaxMessage = 2048;
  absl::string_view message = args->message != nullptr ? args->message : "";
  const std::string lower = absl::AsciiStrToLower(message);
  if (const size_t at = lower.find("authorization"); at != std::string::npos) {
    message = message.substr(0, at + 13);
  }
  absl::string_view file = args->file != nullptr ? args->file : "";
  if (const size_t slash = file.rfind('/'); slash != file.npos) {
    file.remove_prefix(slash + 1);
  }
  syncnorm::LogLine("grpc", args->severity == GPR_LOG_SEVERITY_ERROR
                                ? syncnorm::LogLevel::kError
                                : syncnorm::LogLevel::kInfo)
      .Add("source", absl::StrCat(file, ":", args->line))
      .Add("message", message.size() > kMaxMessage
                          ? absl::StrCat(message.substr(0, kMaxMessage),
                                         "... (", message.size(), " bytes)")
                          : std::string(message));
}

void LogError(absl::string_view event, const absl::Status& status) {
  syncnorm::LogLine(event, syncnorm::LogLevel::kError)
      .Add("error", status.ToString());
}

// Every round's commit fills RocksDB's memtable in arena blocks of 1/8 of
// its write buffer; glibc serves those with a fresh mmap and gives them
// back on every flush, so each page of every round's write was a page
// fault (a third of the commit's time, measured with perf at 2048
// channels). Keep such blocks in the heap and keep a few write buffers of
// freed heap before returning it to the kernel. RSS then stays within
// this slack of the live data.
void TuneMalloc() {
  mallopt(M_MMAP_THRESHOLD,
          static_cast<int>(syncnorm::RocksDbEngine::kWriteBufferSize / 2));
  mallopt(M_TRIM_THRESHOLD,
          static_cast<int>(4 * syncnorm::RocksDbEngine::kWriteBufferSize));
}

// Serves until a stop signal, then shuts down with `shutdown_grace`; the
// process's exit code.
int Serve(const syncnorm::ServerOptions& options, sigset_t stop_signals,
          absl::Duration shutdown_grace) {
  auto server = std::make_unique<syncnorm::Server>(options);
  absl::Status started = server->Start();
  if (!started.ok()) {
    LogError("start_failed", started);
    // Damaged state: starting again will not help until someone acts.
    return absl::IsDataLoss(started) ? kExitDataLoss : 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    absl::Status written =
        syncnorm::WritePortFile(port_file, server->bound_port());
    if (!written.ok()) {
      LogError("start_failed", written);
      server->Shutdown(absl::ZeroDuration());
      server->Wait();
      return 1;
    }
  }
  std::thread stopper([&server, &stop_signals, shutdown_grace] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    syncnorm::LogLine("signal").Add("signal",
                                    signal == SIGINT ? "SIGINT" : "SIGTERM");
    server->Shutdown(shutdown_grace);
  });
  server->Wait();
  stopper.join();
  // Closes the state store (memtable flushed); then the last line.
  server.reset();
  syncnorm::LogLine("stopped").Add("exit_code", 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TuneMalloc();
  if (!syncnorm::ParseFlagsOrPrintHelp(argc, argv, kUsage,
                                       "syncnorm-aggregator")) {
    return 0;
  }
  // Debian's Abseil keeps absl::Mutex deadlock detection on, which records a
  // lock-order graph on every acquisition: a cost on every round's hot path
  // that production servers do not pay. The lock order is checked in tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const sigset_t stop_signals = syncnorm::BlockStopSignals();

  if (absl::Status s = CheckRecoveryFlag(); !s.ok()) {
    LogError("bad_config", s);
    return 2;
  }
  const syncnorm::ServerOptions options = OptionsFromFlags();
  const absl::Duration shutdown_grace = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_shutdown_grace_ms)));
  gpr_set_log_function(LogGrpc);
  if (options.data_dir.empty()) {
    syncnorm::LogLine("no_data_dir", syncnorm::LogLevel::kWarn)
        .Add("note",
             "--data_dir is empty: state is kept in memory and lost "
             "on exit");
  }
  if (absl::GetFlag(FLAGS_check_config)) {
    const absl::Status checked = CheckConfig(options);
    if (!checked.ok()) {
      LogError("bad_config", checked);
      return 2;
    }
    PrintConfig(options, shutdown_grace);
    return 0;
  }
  return Serve(options, stop_signals, shutdown_grace);
}
