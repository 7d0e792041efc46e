#include "relay/relay_server.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shard_router.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "relay/relay_tls.h"
#include "server/domain/limits.h"
#include "server/domain/log.h"

namespace syncnorm {
namespace {

// The calls that legitimate ranks can make the relay hold at once (the
// connection guard's overload line, as the aggregator's): their streams,
// their ReduceOnce calls and a burst of quick ones. 0 (no overload) when
// either bound is lifted.
int64_t LegitimateCalls(const RelayOptions& o) {
  constexpr int64_t kQuickCalls = 1024;
  if (o.max_streams <= 0 || o.max_waiting_calls <= 0) return 0;
  return int64_t{o.max_streams} + o.max_waiting_calls + kQuickCalls;
}

Limits MessageLimit(const RelayOptions& o) {
  Limits limits;
  limits.max_message_bytes = o.max_message_bytes;
  return limits;
}

}  // namespace

absl::Status CheckRelayOptions(const RelayOptions& options) {
  const int b = options.block_positions;
  if (b < 1 || b > (1 << 16) || (b & (b - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_positions is ", b,
        "; it must be a power of two from 1 to 65536 (an aligned block of "
        "positions is a subtree of the shard's merge, so the result is bit "
        "for bit the direct one)"));
  }
  if (options.job_refresh <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("job_refresh_ms must be positive");
  }
  if (options.pass_through_margin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "pass_through_margin_ms must be at least 0");
  }
  if (options.max_pending_blocks_per_job < 1 || options.max_jobs < 1) {
    return absl::InvalidArgumentError(
        "max_pending_blocks_per_job and max_jobs must be positive");
  }
  if (absl::Status s = CheckTransportBytes(options.max_transport_bytes,
                                           MessageLimit(options));
      !s.ok()) {
    return s;
  }
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("listen is empty; give HOST:PORT");
  }
  absl::StatusOr<std::vector<std::string>> shards =
      ParseShardList(options.upstream);
  if (!shards.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upstream: ", shards.status().message()));
  }
  return CheckRelayTls(options);
}

absl::StatusOr<std::unique_ptr<RelayServer>> RelayServer::Start(
    const RelayOptions& options) {
  if (absl::Status s = CheckRelayOptions(options); !s.ok()) return s;
  std::unique_ptr<RelayServer> r(new RelayServer());
  if (!options.tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::Open(options.tokens_file);
    if (!auth.ok()) return auth.status();
    r->auth_ = *std::move(auth);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> served =
      MakeServerCredentials(RelayTlsFiles(options));
  if (!served.ok()) return served.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> dialed =
      MakeUpstreamCredentials(options);
  if (!dialed.ok()) return dialed.status();
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<RelayMetrics>> metrics =
        RelayMetrics::Start(options);
    if (!metrics.ok()) return metrics.status();
    r->metrics_ = *std::move(metrics);
  }
  // The aggregator's defence against flooding connections
  // (server/rpc/connection_guard.h): rapid resets, unauthenticated calls,
  // calls started past what legitimate ranks hold.
  r->clock_ = std::make_unique<RealClock>();
  if (options.memory_trim_period > absl::ZeroDuration()) {
    r->trimmer_ = std::make_unique<MemoryTrimmer>(options.memory_trim_period);
  }
  r->closer_ = std::make_unique<SocketCloser>([trimmer = r->trimmer_.get()] {
    if (trimmer != nullptr) trimmer->ConnectionClosed();
  });
  ConnectionGuardOptions guard_options;
  guard_options.max_calls = LegitimateCalls(options);
  r->guard_ = std::make_unique<ConnectionGuard>(guard_options, r->closer_.get(),
                                                r->clock_.get());
  r->guard_calls_ = std::make_unique<GuardInterceptorFactory>(r->guard_.get());

  // One completion queue, polled by one thread, for every call the relay
  // serves and makes: with gRPC's callback API its threads hand each
  // message to each other (server/rpc/rpc_loop.h).
  grpc::ServerBuilder builder;
  r->read_flood_ =
      std::make_unique<ReadFloodBreaker>(r->closer_.get(), r->guard_.get());
  r->loop_ = std::make_unique<RpcLoop>(
      builder.AddCompletionQueue(/*is_frequently_polled=*/true),
      /*guard=*/nullptr, /*workers=*/0,
      options.close_read_floods ? r->read_flood_.get() : nullptr);
  r->timers_ = std::make_unique<TimerQueue>();
  r->upstream_ = std::make_unique<Upstream>(
      *ParseShardList(options.upstream), options.parent_relay,
      options.upstream_token, *dialed, *r->timers_, r->loop_->cq(),
      UpstreamTlsOn(options));
  r->relay_ = std::make_unique<Relay>(options, *r->upstream_, *r->timers_);
  RelayServiceOptions service_options;
  service_options.auth = r->auth_.get();
  service_options.max_streams = options.max_streams;
  service_options.max_waiting_calls = options.max_waiting_calls;
  service_options.max_message_bytes = options.max_message_bytes;
  service_options.stream_idle_timeout = options.stream_idle_timeout;
  service_options.guard = r->guard_.get();
  service_options.call_observers.push_back(r->guard_calls_.get());
  if (r->metrics_ != nullptr) {
    service_options.call_observers.push_back(r->metrics_->call_observers());
  }
  r->service_ =
      std::make_unique<RelayService>(*r->relay_, std::move(service_options));
  // grpc.health.v1 on the loop: gRPC's own is on the callback API.
  grpc::EnableDefaultHealthCheckService(false);
  r->health_ = std::make_unique<HealthService>(
      std::vector<std::string>{v1::Aggregator::service_full_name()});

  builder.AddListeningPort(options.listen, *served, &r->port_);
  builder.RegisterService(r->service_.get());
  builder.RegisterService(r->health_.get());
  // Above the bound, so that a message somewhat over it reaches the
  // service, which refuses it naming --max_message_bytes.
  builder.SetMaxReceiveMessageSize(ReceiveCeiling(MessageLimit(options)));
  if (options.max_streams_per_connection > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options.max_streams_per_connection);
  }
  // gRPC 1.51 buffers a whole message before checking its size: the quota
  // is what bounds the transport's memory, its connections' included.
  if (options.max_transport_bytes > 0) {
    grpc::ResourceQuota quota("syncnorm-relay");
    quota.Resize(static_cast<size_t>(options.max_transport_bytes));
    builder.SetResourceQuota(quota);  // takes its own reference
  }
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<GuardInterceptorFactory>(r->guard_.get()));
  if (r->metrics_ != nullptr) {
    interceptors.push_back(r->metrics_->NewInterceptorFactory());
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr || r->port_ == 0) {
    if (r->server_ != nullptr) r->server_->Shutdown();
    r->server_.reset();
    r->upstream_->Shutdown();  // no call was made
    r->timers_->Stop();
    r->loop_->Stop();  // never started: drains the queue here
    return absl::UnavailableError(
        absl::StrCat("cannot serve on ", options.listen));
  }
  r->service_->Listen(r->loop_.get());
  r->health_->Listen(r->loop_.get());
  r->loop_->Start();
  r->health_->SetServing(true);
  r->closer_->set_server_port(r->port_);
  if (r->metrics_ != nullptr) {
    // Cleared in ~RelayServer before what it reads goes.
    r->metrics_->SetSource([server = r.get()] { return server->load(); });
  }
  LogLine("relay_started")
      .Add("listen", options.listen)
      .Add("port", r->port_)
      .Add("tls", options.tls_cert.empty()        ? "off"
                  : options.tls_client_ca.empty() ? "on"
                                                  : "mutual")
      .Add("upstream_tls", UpstreamTlsOn(options) ? "on" : "off")
      .Add("shards", r->upstream_->num_shards())
      .Add("block_positions", options.block_positions)
      .Add("max_streams", options.max_streams)
      .Add("max_waiting_calls", options.max_waiting_calls)
      .Add("max_message_bytes", options.max_message_bytes)
      .Add("max_transport_bytes", options.max_transport_bytes)
      .Add("metrics_port", r->metrics_port());
  return r;
}

RelayServer::~RelayServer() {
  Shutdown();
  if (metrics_ != nullptr) metrics_->SetSource({});
}

RelayLoad RelayServer::load() const {
  RelayLoad load;
  load.relay = relay_->counters();
  load.upstream = upstream_->counters();
  load.service = service_->counters();
  load.grpc_calls = guard_->calls_held();
  for (int r = 0; r < kCloseReasons; ++r) {
    load.connections_closed[r] = guard_->closed(static_cast<CloseReason>(r));
  }
  return load;
}

void RelayServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  // NOT_SERVING from now on, to probes; Watch calls end.
  health_->Shutdown();
  // Each stream ends UNAVAILABLE once it has answered what it read, so
  // its client resends the rest elsewhere; answers still due after the
  // grace go nowhere once the calls are gone; then no timer fires into the
  // relay, and no call to a shard is left in flight (their ends are
  // polled by the loop); then the loop stops.
  service_->CloseStreams();
  server_->Shutdown(absl::ToChronoTime(deadline));
  timers_->Stop();
  upstream_->Shutdown();
  loop_->Stop();
}

}  // namespace syncnorm
