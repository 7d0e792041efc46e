// syncnorm_relay: parses flags into RelayOptions, serves rounds until
// SIGTERM or SIGINT (docs/relay.md).
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "relay/relay_options.h"
#include "relay/relay_server.h"
#include "relay/relay_tls.h"
#include "server/domain/log.h"
#include "server/flags_help.h"
#include "server/process.h"
#include "server/rpc/auth.h"

namespace {

// The defaults of the flags: RelayOptions' own, written once
// (relay_options.h).
const syncnorm::RelayOptions& Defaults() {
  static const auto* const kDefaults = new syncnorm::RelayOptions();
  return *kDefaults;
}

int64_t Ms(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

constexpr char kUsage[] =
    "Usage: syncnorm_relay --upstream=SHARDS [--flag=value ...]\n"
    "Serves syncnorm rounds (Reduce, ReduceOnce) to a block of ranks and "
    "sends each\nblock's merge to the layer's aggregator shard, until "
    "SIGTERM or SIGINT. See\ndocs/relay.md.";

}  // namespace

ABSL_FLAG(std::string, listen, Defaults().listen,
          "HOST:PORT to serve the ranks on; port 0 picks a free port");
ABSL_FLAG(std::string, tls_cert, Defaults().tls_cert,
          "Certificate chain (PEM) served to the ranks; with --tls_key, TLS");
ABSL_FLAG(std::string, tls_key, Defaults().tls_key,
          "Private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_client_ca, Defaults().tls_client_ca,
          "CA (PEM) that signs the ranks' certificates: mutual TLS");
ABSL_FLAG(bool, allow_insecure, Defaults().allow_insecure,
          "Serve plaintext on a non-loopback --listen (else TLS is needed)");
ABSL_FLAG(std::string, upstream, Defaults().upstream,
          "The aggregator shards, as the client's address: host:port, a "
          "comma-separated list, or a {A..B} range");
ABSL_FLAG(std::string, parent_relay, Defaults().parent_relay,
          "A parent relay (HOST:PORT) that takes this relay's upstream "
          "contributions instead of the shards; its --block_positions must "
          "be larger. Empty: the shards");
ABSL_FLAG(int, block_positions, Defaults().block_positions,
          "Positions of a group merged into one upstream contribution: a "
          "power of two");
ABSL_FLAG(bool, upstream_tls, Defaults().upstream_tls,
          "Dial the shards with TLS (on too when an --upstream_tls_* file "
          "is given)");
ABSL_FLAG(std::string, upstream_tls_root_ca, Defaults().upstream_tls_root_ca,
          "CA (PEM) that signed the shards' certificates; empty: the system "
          "roots");
ABSL_FLAG(std::string, upstream_tls_client_cert,
          Defaults().upstream_tls_client_cert,
          "The relay's certificate (PEM) for shards that require mutual TLS");
ABSL_FLAG(std::string, upstream_tls_client_key,
          Defaults().upstream_tls_client_key,
          "Private key of --upstream_tls_client_cert (PEM)");
ABSL_FLAG(std::string, upstream_token_file, "",
          "File holding the relay's bearer token for the shards (a `relay` "
          "or `admin` scope); empty: none");
ABSL_FLAG(std::string, tokens_file, Defaults().tokens_file,
          "Tokens file (the aggregator's format) that the ranks' tokens are "
          "checked against, reread every second; empty: no check");
ABSL_FLAG(int64_t, job_refresh_ms, Ms(Defaults().job_refresh),
          "How long an incomplete block waits before the relay rereads its "
          "job (GetJob)");
ABSL_FLAG(int64_t, pass_through_margin_ms, Ms(Defaults().pass_through_margin),
          "An incomplete block goes through unmerged this long before the "
          "job's quorum grace or round timeout");
ABSL_FLAG(int, max_pending_blocks_per_job,
          Defaults().max_pending_blocks_per_job,
          "Block rounds of one job held at once; past it RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_jobs, Defaults().max_jobs,
          "(job, shard) pairs the relay keeps; past it the idlest goes, or "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (atomically) once serving");
ABSL_FLAG(std::string, metrics_listen, Defaults().metrics_listen,
          "HOST:PORT of the Prometheus endpoint (HTTP GET /metrics); port 0 "
          "picks a free one (logged in the start line). Empty: no metrics");

// Bounds, as the aggregator's flags of the same names: exceeding one is
// RESOURCE_EXHAUSTED naming it; <= 0: no limit. docs/relay.md, "What the
// ranks can make a relay hold", derives the relay's memory from them.
ABSL_FLAG(int64_t, max_message_bytes, Defaults().max_message_bytes,
          "Largest contribution (serialized), in bytes; gRPC's transport "
          "cuts off messages over twice this with its own error");
ABSL_FLAG(int, max_streams, Defaults().max_streams,
          "Open Reduce streams (a stream keeps its slot while the relay "
          "holds what it sent); each holds at most 4 x --max_message_bytes");
ABSL_FLAG(int, max_waiting_calls, Defaults().max_waiting_calls,
          "ReduceOnce calls in progress");
ABSL_FLAG(int, max_streams_per_connection,
          Defaults().max_streams_per_connection,
          "HTTP/2 streams (calls) one connection may have open at once, as "
          "advertised to clients (gRPC clients queue calls beyond it)");
ABSL_FLAG(int64_t, stream_idle_timeout_ms, Ms(Defaults().stream_idle_timeout),
          "A Reduce stream idle this long (nothing read, answered or "
          "written) ends UNAVAILABLE, freeing its --max_streams slot; "
          "clients reopen on next use. <= 0: never");
ABSL_FLAG(int64_t, max_transport_bytes, Defaults().max_transport_bytes,
          "Memory gRPC's transport may hold, in bytes: messages still "
          "arriving, every stream's unread data, read buffers. Past it gRPC "
          "cancels streams, its oldest connections' first, with its own "
          "RESOURCE_EXHAUSTED naming no flag. At least twice "
          "--max_message_bytes");

ABSL_FLAG(bool, check_config, false,
          "Check the flags and the files they name, and exit without "
          "serving: 0 when the relay could start with them, 2 and the "
          "reason if not");

namespace {

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path);
  std::stringstream s;
  if (in) s << in.rdbuf();
  if (!in || in.bad()) {
    return absl::NotFoundError(
        absl::StrCat("--upstream_token_file: cannot read '", path, "'"));
  }
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

void LogError(absl::string_view event, const absl::Status& status) {
  syncnorm::LogLine(event, syncnorm::LogLevel::kError)
      .Add("error", status.ToString());
}

// The options the flags say: the one place they are read.
syncnorm::RelayOptions OptionsFromFlags() {
  syncnorm::RelayOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  options.upstream = absl::GetFlag(FLAGS_upstream);
  options.parent_relay = absl::GetFlag(FLAGS_parent_relay);
  options.upstream_tls = absl::GetFlag(FLAGS_upstream_tls);
  options.upstream_tls_root_ca = absl::GetFlag(FLAGS_upstream_tls_root_ca);
  options.upstream_tls_client_cert =
      absl::GetFlag(FLAGS_upstream_tls_client_cert);
  options.upstream_tls_client_key =
      absl::GetFlag(FLAGS_upstream_tls_client_key);
  options.block_positions = absl::GetFlag(FLAGS_block_positions);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.job_refresh = absl::Milliseconds(absl::GetFlag(FLAGS_job_refresh_ms));
  options.pass_through_margin =
      absl::Milliseconds(absl::GetFlag(FLAGS_pass_through_margin_ms));
  options.max_pending_blocks_per_job =
      absl::GetFlag(FLAGS_max_pending_blocks_per_job);
  options.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.max_waiting_calls = absl::GetFlag(FLAGS_max_waiting_calls);
  options.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  options.stream_idle_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_stream_idle_timeout_ms));
  options.max_transport_bytes = absl::GetFlag(FLAGS_max_transport_bytes);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  return options;
}

// What --check_config checks beyond the options: the files they name load
// (the TLS files, the tokens file; the token file is read before).
absl::Status CheckFiles(const syncnorm::RelayOptions& options) {
  if (absl::Status s = syncnorm::CheckRelayTlsFiles(options); !s.ok()) {
    return s;
  }
  if (!options.tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<syncnorm::Authenticator>> auth =
        syncnorm::Authenticator::Open(options.tokens_file);
    if (!auth.ok()) {
      return absl::Status(
          auth.status().code(),
          absl::StrCat("--tokens_file: ", auth.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Exit codes, as the aggregator's: 2 for flags that cannot work (and for
// anything --check_config finds), 1 for a start that failed (a file that
// cannot be read, an address that cannot be bound), 0 after SIGTERM or
// SIGINT.
int main(int argc, char** argv) {
  if (!syncnorm::ParseFlagsOrPrintHelp(argc, argv, kUsage, "syncnorm_relay")) {
    return 0;
  }
  // As the aggregator (server/main.cc): Debian's Abseil keeps absl::Mutex
  // deadlock detection on, a lock-order graph updated on every acquisition
  // of every round. The lock order is checked in tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const sigset_t stop_signals = syncnorm::BlockStopSignals();

  syncnorm::RelayOptions options = OptionsFromFlags();
  const bool check_config = absl::GetFlag(FLAGS_check_config);
  if (absl::Status s = syncnorm::CheckRelayOptions(options); !s.ok()) {
    LogError("bad_config", s);
    return 2;
  }
  // A file that cannot be read fails the start (1), as the aggregator's
  // files do; --check_config reports it as a bad config (2).
  absl::StatusOr<std::string> token =
      ReadToken(absl::GetFlag(FLAGS_upstream_token_file));
  if (!token.ok()) {
    LogError(check_config ? "bad_config" : "start_failed", token.status());
    return check_config ? 2 : 1;
  }
  options.upstream_token = *token;
  if (check_config) {
    if (absl::Status s = CheckFiles(options); !s.ok()) {
      LogError("bad_config", s);
      return 2;
    }
    std::printf(
        "syncnorm_relay: config ok: listen=%s upstream=%s block_positions=%d "
        "upstream_tls=%s tls=%s tokens_file=%s max_message_bytes=%lld "
        "max_streams=%d max_waiting_calls=%d max_streams_per_connection=%d "
        "stream_idle_timeout_ms=%lld max_transport_bytes=%lld "
        "max_pending_blocks_per_job=%d max_jobs=%d metrics_listen=%s\n",
        options.listen.c_str(), options.upstream.c_str(),
        options.block_positions,
        syncnorm::UpstreamTlsOn(options) ? "on" : "off",
        options.tls_cert.empty()        ? "off"
        : options.tls_client_ca.empty() ? "on"
                                        : "mutual",
        options.tokens_file.empty() ? "-" : options.tokens_file.c_str(),
        static_cast<long long>(options.max_message_bytes), options.max_streams,
        options.max_waiting_calls, options.max_streams_per_connection,
        static_cast<long long>(Ms(options.stream_idle_timeout)),
        static_cast<long long>(options.max_transport_bytes),
        options.max_pending_blocks_per_job, options.max_jobs,
        options.metrics_listen.empty() ? "-" : options.metrics_listen.c_str());
    return 0;
  }
  absl::StatusOr<std::unique_ptr<syncnorm::RelayServer>> relay =
      syncnorm::RelayServer::Start(options);
  if (!relay.ok()) {
    LogError("start_failed", relay.status());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status s = syncnorm::WritePortFile(port_file, (*relay)->port());
        !s.ok()) {
      LogError("start_failed", s);
      return 1;
    }
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  syncnorm::LogLine("signal").Add("signal",
                                  signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*relay)->Shutdown();
  return 0;
}
