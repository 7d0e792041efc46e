// Everything the aggregator server can be told at start, and the one check
// of it. The binary's flags (main.cc) mirror these fields and take their
// defaults from here; defaults that the domain's options share are named
// constants of those (kDefaultRoundTimeout, ...), written once there.
#ifndef SYNCNORM_SERVER_SERVER_OPTIONS_H_
#define SYNCNORM_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/domain/aggregator.h"
#include "server/domain/job.h"
#include "server/domain/limits.h"
#include "server/domain/round_observer.h"
#include "server/rpc/auth.h"
#include "server/store/ring_log_engine.h"

namespace syncnorm {

inline constexpr int kDefaultRoundLogMib = 64;
inline constexpr int kMaxRoundLogMib = 4096;

struct ServerOptions {
  // HOST:PORT to listen on (insecure). Port 0 picks a free port; see
  // Server::bound_port(). Default "127.0.0.1:50051".
  std::string listen = "127.0.0.1:50051";
  // How long a round waits for missing ranks when its job sets no
  // round_timeout_ms. Positive, at most kMaxRoundTimeout (24 h). Default
  // 30 s.
  absl::Duration round_timeout = kDefaultRoundTimeout;
  // Folder of the state store (RocksDB; created with its parents if
  // missing): job specs, running statistics, the rounds retries may ask
  // about, checkpoints. Empty keeps state in memory only (nothing survives
  // a restart; for tests). Default "./syncnorm-data".
  std::string data_dir = "./syncnorm-data";
  // Folder for backups (Backup, ListBackups, RestoreBackup; created if
  // missing), best on another volume than data_dir's. Empty: backups are
  // off. Default empty.
  std::string backup_dir;
  // fsync the write-ahead log on every update, so that an acknowledged
  // update also survives a machine crash or power loss (a killed process
  // loses nothing either way). Default false.
  bool sync_writes = false;
  // The round log's size in MiB (server/store/ring_log_engine.h): flushed
  // to RocksDB when half full or once a second. A round's record, deleted
  // 8 steps later, never reaches RocksDB when 8 steps of the shard's
  // records fit in half the ring: best 16 steps, about 768 bytes per
  // channel summed over the shard's jobs (docs/operations.md, "Sizing
  // it"). The server's resident memory includes it. 1 to 4096. Default 64.
  int round_log_mib = kDefaultRoundLogMib;
  // What the start does with a damaged round log (RingLogRecovery): by
  // default a torn last record is dropped and any other damage stops the
  // start (DATA_LOSS naming the file, the offset and what would be lost);
  // kPointInTime replays up to the damage and drops the rest, the
  // operator's acceptance of that loss. Default kTolerateTornTail.
  RingLogRecovery round_log_recovery = RingLogRecovery::kTolerateTornTail;
  // Untagged checkpoints kept per job, newest first; tagged ones are always
  // kept. 0 keeps all. Default 5.
  int keep_checkpoints = kDefaultKeepCheckpoints;
  // How often overdue rounds are failed. Positive. Default 20 ms.
  absl::Duration reaper_period = kDefaultReaperPeriod;
  // A contributor that arrives more than this after its round's first one
  // is a straggler (log lines, syncnorm_stragglers_total). Must be >= 0.
  // Default 1 s.
  absl::Duration straggler_threshold = kDefaultStragglerThreshold;
  // How long a job's straggler and quorum rounds are counted into one log
  // line after the first one's own (LoggingRoundObserver); zero: a line per
  // round. Must be >= 0. Default 10 s.
  absl::Duration log_interval = LoggingRoundObserver::kDefaultInterval;
  // HOST:PORT of the Prometheus endpoint (HTTP GET /metrics; see
  // server/metrics/metrics.h); port 0 picks a free one
  // (Server::metrics_port()). Empty: no metrics endpoint. Default empty.
  std::string metrics_listen;
  // How often the heap trimmer decides whether to give freed heap back to
  // the kernel (see MemoryTrimmer). Zero or less: never. Default 5 s.
  absl::Duration memory_trim_period = absl::Seconds(5);
  // Whether the RPC loop's watchdog closes connections that flood its
  // thread (server/rpc/read_flood.h). It judges by the process's resident
  // memory, so a server that shares its process with other work (an
  // in-process server in a test) turns it off. Default true.
  bool close_read_floods = true;

  // ---- Security (see docs/operations.md, "Security") ----
  // TLS: the server's certificate chain and private key (PEM files); both
  // or neither. With tls_client_ca, clients must present a certificate
  // signed by that CA (mutual TLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Without TLS, Start() refuses a listen address that is not loopback
  // unless this is set. Default false.
  bool allow_insecure = false;
  // Bearer tokens and their scopes (format in server/rpc/auth.h), re-read every
  // tokens_poll_period when it changes. Empty: no authentication.
  std::string tokens_file;
  absl::Duration tokens_poll_period = Authenticator::kDefaultPollPeriod;

  // ---- Limits (see limits.h) ----
  Limits limits;
  // HTTP/2 streams (calls) one connection may have open at once, as the
  // server advertises it (SETTINGS_MAX_CONCURRENT_STREAMS): gRPC clients
  // queue calls beyond it; gRPC closes the connection of a client that
  // acknowledged it and goes past it. Zero or less: none advertised.
  // Default 1000.
  int max_streams_per_connection = 1000;
  // A Reduce stream that reads, answers and writes nothing for this long
  // ends UNAVAILABLE, freeing its slot of limits.max_streams (the clients
  // open a new one when they next send). Zero or less: never. Default 5
  // minutes.
  absl::Duration stream_idle_timeout = absl::Minutes(5);
  // What gRPC's transport may hold in memory, in bytes (a
  // grpc::ResourceQuota): data it has read and not yet handed to the
  // service (every message still arriving, whole, and every stream's
  // unread data), its read buffers and per-call arenas. Past it gRPC
  // cancels streams, those of its oldest connections first, until it is
  // back under: that cuts off a message too large to hold before all of it
  // has arrived, and may cut legitimate streams too. Their clients get
  // gRPC's RESOURCE_EXHAUSTED, naming no flag. Zero or less: no quota.
  // When both are set it must be at least ReceiveCeiling(limits)
  // (CheckTransportBytes). Default 1 GiB.
  int64_t max_transport_bytes = int64_t{1} << 30;
};

// The check of the options themselves, the one that Server::Start and
// --check_config share: what Start refuses before it opens anything.
// INVALID_ARGUMENT naming the flag: round_timeout_ms, reaper_period,
// keep_checkpoints, straggler_threshold_ms or log_interval_ms out of range,
// max_transport_bytes below what max_message_bytes needs, TLS files given
// by halves, plaintext on a non-loopback listen address without
// allow_insecure.
absl::Status CheckServerOptions(const ServerOptions& options);

// What Start finds out only by trying, for --check_config, which serves
// nothing. CheckServerPlaces: listen and metrics_listen are HOST:PORT with
// a port in 0..65535 (INVALID_ARGUMENT), data_dir and backup_dir are
// writable folders or can be made (FAILED_PRECONDITION, PERMISSION_DENIED).
// CheckServerFiles: the TLS files and the tokens file load (their errors).
// Each names the flag.
absl::Status CheckServerPlaces(const ServerOptions& options);
absl::Status CheckServerFiles(const ServerOptions& options);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_SERVER_OPTIONS_H_
