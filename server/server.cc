#include "server/server.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/domain/limits.h"
#include "server/domain/log.h"
#include "server/rpc/guard_interceptor.h"
#include "server/rpc/reflection_service.h"
#include "server/rpc/tls.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/ring_log_engine.h"
#include "server/store/rocksdb_engine.h"

namespace syncnorm {
namespace {

// Threads for the calls that may block on the state store (rpc_loop.h):
// all but Reduce, ReduceOnce, Checkpoint, health and reflection.
constexpr int kRpcWorkers = 4;

// The calls that legitimate clients can make the server hold at once:
// their streams, their waiting calls and a burst of quick ones. 0 (no
// overload) when either limit is lifted.
int64_t LegitimateCalls(const Limits& limits) {
  constexpr int64_t kQuickCalls = 1024;
  if (limits.max_streams <= 0 || limits.max_waiting_calls <= 0) return 0;
  return int64_t{limits.max_streams} + limits.max_waiting_calls + kQuickCalls;
}

AggregatorOptions ToAggregatorOptions(const ServerOptions& options) {
  AggregatorOptions out;
  out.default_round_timeout = options.round_timeout;
  out.reaper_period = options.reaper_period;
  out.keep_checkpoints = options.keep_checkpoints;
  out.limits = options.limits;
  out.straggler_threshold = options.straggler_threshold;
  return out;
}

// The lines a round log's recovery is worth: what it replayed, and what
// it dropped.
void LogRecovery(const RingLogEngine& log, const std::string& path,
                 const std::string& data_dir) {
  if (log.recovered_records() > 0) {
    LogLine("round_log_replayed")
        .Add("records", log.recovered_records())
        .Add("data_dir", data_dir);
  }
  if (const std::optional<RingLogDamage>& d = log.damage(); d.has_value()) {
    LogLine("round_log_loss_accepted", LogLevel::kError)
        .Add("file", path)
        .Add("offset", d->offset)
        .Add("records_lost", d->records_after)
        .Add("truncated", d->truncated() ? "true" : "false")
        .Add("error", d->Describe(path));
  }
  if (const std::optional<RingLogDamage>& t = log.torn_tail(); t.has_value()) {
    LogLine("round_log_torn_tail", LogLevel::kWarn)
        .Add("file", path)
        .Add("offset", t->offset)
        .Add("note",
             "the last record was cut short (a crash while it was written, "
             "never acknowledged) and is dropped");
  }
}

// With a data dir, `*round_log` is set to the store's round log.
absl::StatusOr<std::unique_ptr<StateStore>> OpenStore(
    const ServerOptions& options, RingLogEngine** round_log) {
  if (options.data_dir.empty()) {
    return std::unique_ptr<StateStore>(
        std::make_unique<KvStateStore>(std::make_unique<MemoryEngine>()));
  }
  absl::StatusOr<std::unique_ptr<RocksDbEngine>> engine =
      RocksDbEngine::Open(options.data_dir, options.sync_writes);
  if (!engine.ok()) return engine.status();
  // Rounds are durable in the ring log; RocksDB gets them in bulk.
  RingLogOptions ring;
  ring.sync_writes = options.sync_writes;
  ring.ring_bytes = int64_t{options.round_log_mib} << 20;
  ring.flush_bytes = ring.ring_bytes / 2;
  ring.recovery = options.round_log_recovery;
  const std::string path = options.data_dir + "/" + kRoundLogFile;
  absl::StatusOr<std::unique_ptr<RingLogEngine>> logged =
      RingLogEngine::Open(path, *std::move(engine), ring);
  if (absl::IsDataLoss(logged.status())) {
    return absl::DataLossError(absl::StrCat(
        logged.status().message(),
        "; nothing was changed: restore the data_dir from a backup, or "
        "start once with --round_log_recovery=point_in_time to accept the "
        "loss (the state then ends before that record)"));
  }
  if (!logged.ok()) return logged.status();
  *round_log = logged->get();
  LogRecovery(**logged, path, options.data_dir);
  return std::unique_ptr<StateStore>(
      std::make_unique<KvStateStore>(*std::move(logged)));
}

// Backups on the data dir's own filesystem go with it when the volume is
// lost; worth a line in the log, not a refusal (tests and one-machine
// setups keep both on one disk).
void WarnIfSameVolume(const std::string& data_dir,
                      const std::string& backup_dir) {
  struct stat data, backup;
  if (data_dir.empty() || ::stat(data_dir.c_str(), &data) != 0 ||
      ::stat(backup_dir.c_str(), &backup) != 0 ||
      data.st_dev != backup.st_dev) {
    return;
  }
  LogLine("warning")
      .Add("what",
           "backup_dir is on the same filesystem as data_dir: a lost volume "
           "loses the backups too")
      .Add("data_dir", data_dir)
      .Add("backup_dir", backup_dir);
}

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)), clock_(std::make_unique<RealClock>()) {}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  Wait();
  absl::MutexLock lock(&mu_);
  if (metrics_ != nullptr) metrics_->SetLoadSource({});
}

absl::Status Server::Start() {
  if (absl::Status s = CheckServerOptions(options_); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(TlsFiles{options_.tls_cert, options_.tls_key,
                                     options_.tls_client_ca});
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<Authenticator> auth;
  if (!options_.tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<Authenticator>> opened =
        Authenticator::Open(options_.tokens_file, options_.tokens_poll_period);
    if (!opened.ok()) return opened.status();
    auth = *std::move(opened);
  }
  absl::MutexLock lock(&mu_);
  if (store_ != nullptr || shut_down_) {
    return absl::FailedPreconditionError("the server was already started");
  }
  RingLogEngine* round_log = nullptr;  // owned by the store
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      OpenStore(options_, &round_log);
  if (!store.ok()) return store.status();
  AggregatorOptions aggregator_options = ToAggregatorOptions(options_);
  LoggingRoundObserver::Options log_options;
  log_options.interval = options_.log_interval;
  log_ = std::make_unique<LoggingRoundObserver>(log_options);
  std::vector<RoundObserver*> observers = {log_.get()};
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics =
        Metrics::Start(options_.metrics_listen, options_.limits);
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    observers.push_back(metrics_->round_observer());
  }
  observers_ = std::make_unique<FanoutRoundObserver>(std::move(observers));
  aggregator_options.observer = observers_.get();
  auto aggregator = std::make_unique<Aggregator>(std::move(aggregator_options),
                                                 clock_.get(), store->get());
  if (absl::Status s = aggregator->Load(); !s.ok()) return s;
  if (!options_.backup_dir.empty()) {
    absl::StatusOr<std::unique_ptr<BackupRoot>> backups =
        BackupRoot::Open(options_.backup_dir, store->get(), clock_.get());
    if (!backups.ok()) return backups.status();
    backups_ = *std::move(backups);
    WarnIfSameVolume(options_.data_dir, options_.backup_dir);
  }
  store_ = *std::move(store);
  aggregator_ = std::move(aggregator);
  auth_ = std::move(auth);
  if (options_.memory_trim_period > absl::ZeroDuration()) {
    trimmer_ = std::make_unique<MemoryTrimmer>(options_.memory_trim_period);
  }
  closer_ = std::make_unique<SocketCloser>([trimmer = trimmer_.get()] {
    if (trimmer != nullptr) trimmer->ConnectionClosed();
  });
  ConnectionGuardOptions guard_options;
  guard_options.max_calls = LegitimateCalls(options_.limits);
  guard_ = std::make_unique<ConnectionGuard>(guard_options, closer_.get(),
                                             clock_.get());
  read_flood_ = std::make_unique<ReadFloodBreaker>(closer_.get(), guard_.get());
  ServiceOptions service_options;
  service_options.auth = auth_.get();
  service_options.max_streams = options_.limits.max_streams;
  service_options.max_waiting_calls = options_.limits.max_waiting_calls;
  service_options.max_message_bytes = options_.limits.max_message_bytes;
  service_options.backups = backups_.get();
  service_options.stream_idle_timeout = options_.stream_idle_timeout;
  service_options.clock = clock_.get();
  // The Reduce stream reports itself to the guard and the metrics; their
  // interceptors skip it (call_observer.h).
  guard_calls_ = std::make_unique<GuardInterceptorFactory>(guard_.get());
  service_options.call_observers.push_back(guard_calls_.get());
  if (metrics_ != nullptr) {
    service_options.call_observers.push_back(metrics_->call_observers());
  }
  service_ =
      std::make_unique<AggregatorService>(aggregator_.get(), service_options);
  if (metrics_ != nullptr) {
    // Cleared in ~Server before the aggregator and the service go.
    metrics_->SetLoadSource([aggregator = aggregator_.get(),
                             service = service_.get(), guard = guard_.get(),
                             round_log] {
      ServerLoad load;
      load.jobs = aggregator->job_count();
      load.rounds_in_flight = aggregator->rounds_in_flight();
      load.open_streams = service->open_streams();
      load.waiting_calls = service->waiting_calls();
      load.grpc_calls = guard->calls_held();
      for (int r = 0; r < kCloseReasons; ++r) {
        load.connections_closed[r] = guard->closed(static_cast<CloseReason>(r));
      }
      if (round_log != nullptr) {
        const RingLogEngine::TransientBytes log = round_log->transient_bytes();
        load.durable = true;
        load.round_log_bytes = log.logged;
        load.round_log_spilled_bytes = log.spilled;
      }
      return load;
    });
  }
  // gRPC's default health service is on the callback API, whose threads
  // would poll beside the loop's (rpc_loop.h): ours serves instead.
  grpc::EnableDefaultHealthCheckService(false);
  health_ = std::make_unique<HealthService>(
      std::vector<std::string>{v1::Aggregator::service_full_name()});
  // Reflection describes what the generated descriptor pool holds: our
  // services, grpc.health.v1, and itself.
  reflection_ = std::make_unique<ReflectionService>(std::vector<std::string>{
      v1::Aggregator::service_full_name(),
      grpc::health::v1::Health::service_full_name(),
      grpc::reflection::v1alpha::ServerReflection::service_full_name()});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, *credentials, &port);
  // As the client (client/client.cc): large rounds fit the HTTP/2 stream
  // window and a few frames, so no window-update round trip per round.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  // gRPC 1.51 enforces this only on clients that acknowledged it and does
  // not count streams the client reset: the guard covers the rest.
  if (options_.max_streams_per_connection > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options_.max_streams_per_connection);
  }
  // Above the limit, so that the service sees a message somewhat over it
  // and refuses it naming --max_message_bytes (see ReceiveCeiling).
  builder.SetMaxReceiveMessageSize(ReceiveCeiling(options_.limits));
  // gRPC 1.51 buffers a whole message before checking its size, and the
  // length prefix allows 4 GiB: the quota is what bounds the transport's
  // memory. Past it gRPC cancels streams until it is back under.
  if (options_.max_transport_bytes > 0) {
    grpc::ResourceQuota quota("syncnorm-aggregator");
    quota.Resize(static_cast<size_t>(options_.max_transport_bytes));
    builder.SetResourceQuota(quota);  // takes its own reference
  }
  builder.RegisterService(service_.get());
  builder.RegisterService(reflection_.get());
  builder.RegisterService(health_.get());
  std::unique_ptr<grpc::ServerCompletionQueue> cq =
      builder.AddCompletionQueue(/*is_frequently_polled=*/true);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<GuardInterceptorFactory>(guard_.get()));
  if (metrics_ != nullptr) {
    for (auto& factory : metrics_->NewInterceptorFactories()) {
      interceptors.push_back(std::move(factory));
    }
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    cq->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options_.listen,
        "'; check that it is HOST:PORT and that the port is free"));
  }
  loop_ = std::make_unique<RpcLoop>(
      std::move(cq), guard_.get(), kRpcWorkers,
      options_.close_read_floods ? read_flood_.get() : nullptr);
  service_->Listen(loop_.get());
  reflection_->Listen(loop_.get());
  health_->Listen(loop_.get());
  loop_->Start();
  health_->SetServing(true);
  aggregator_->StartReaper();
  closer_->set_server_port(port);
  server_ = std::move(server);
  bound_port_ = port;
  LogLine("start")
      .Add("listen", options_.listen)
      .Add("port", port)
      .Add("tls", options_.tls_cert.empty()        ? "off"
                  : options_.tls_client_ca.empty() ? "on"
                                                   : "mutual")
      .Add("auth", options_.tokens_file.empty() ? "none" : "tokens")
      .Add("data_dir", options_.data_dir)
      .Add("backup_dir", options_.backup_dir)
      .Add("jobs", aggregator_->ListJobs().size())
      .Add("metrics_port", metrics_ == nullptr ? 0 : metrics_->port());
  return absl::OkStatus();
}

int Server::bound_port() const {
  absl::MutexLock lock(&mu_);
  return bound_port_;
}

int Server::metrics_port() const {
  absl::MutexLock lock(&mu_);
  return metrics_ == nullptr ? 0 : metrics_->port();
}

void Server::Shutdown(absl::Duration grace) {
  const absl::Time deadline = absl::Now() + grace;
  grpc::Server* server = nullptr;
  Aggregator* aggregator = nullptr;
  AggregatorService* service = nullptr;
  HealthService* health = nullptr;
  RpcLoop* loop = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (server_ == nullptr || shut_down_) return;
    shut_down_ = true;
    server = server_.get();
    aggregator = aggregator_.get();
    service = service_.get();
    health = health_.get();
    loop = loop_.get();
  }
  // NOT_SERVING from now on; Watch calls end, so that none holds the
  // server's shutdown up.
  health->Shutdown();
  // New rounds are refused from here on; contributions to rounds in flight,
  // on open or new streams, are still taken until those rounds finish.
  aggregator->StartDraining();
  const absl::Time start = absl::Now();
  const int64_t in_flight = aggregator->rounds_in_flight();
  LogLine("shutdown")
      .Add("grace_ms", absl::ToInt64Milliseconds(grace))
      .Add("rounds_in_flight", in_flight)
      .Add("streams_open", service->open_streams());
  const bool drained = aggregator->AwaitRoundsDone(deadline);
  const int64_t left = drained ? 0 : aggregator->rounds_in_flight();
  const int streams = service->open_streams();
  service->CloseStreams();
  // What was drained: rounds still unfinished when the grace ran out fail
  // UNAVAILABLE, and the streams end UNAVAILABLE once their results are
  // written.
  LogLine("drained", drained ? LogLevel::kInfo : LogLevel::kWarn)
      .Add("rounds_finished", std::max<int64_t>(0, in_flight - left))
      .Add("rounds_failed", left)
      .Add("streams_closed", streams)
      .Add("waited_ms", absl::ToInt64Milliseconds(absl::Now() - start));
  // Returns once every call is over (those left at the deadline are
  // cancelled); the loop's thread serves them until then.
  server->Shutdown(absl::ToChronoTime(deadline));
  loop->Stop();
}

void Server::Wait() {
  grpc::Server* server = nullptr;
  {
    absl::MutexLock lock(&mu_);
    server = server_.get();
  }
  if (server != nullptr) server->Wait();
}

}  // namespace syncnorm
