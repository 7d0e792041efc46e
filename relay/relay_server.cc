#include "relay/relay_server.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shard_router.h"
#include "grpcpp/grpcpp.h"
#include "relay/relay_tls.h"
#include "server/domain/log.h"

namespace syncnorm {

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
  r->timers_ = std::make_unique<TimerQueue>();
  r->upstream_ = std::make_unique<Upstream>(
      *ParseShardList(options.upstream), options.parent_relay,
      options.upstream_token, *dialed, *r->timers_);
  r->relay_ = std::make_unique<Relay>(options, *r->upstream_, *r->timers_);
  r->service_ = std::make_unique<RelayService>(*r->relay_, r->auth_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *served, &r->port_);
  builder.RegisterService(r->service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr || r->port_ == 0) {
    r->upstream_->Shutdown();
    r->timers_->Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot serve on ", options.listen));
  }
  LogLine("relay_started")
      .Add("listen", options.listen)
      .Add("port", r->port_)
      .Add("tls", options.tls_cert.empty()        ? "off"
                  : options.tls_client_ca.empty() ? "on"
                                                  : "mutual")
      .Add("upstream_tls", UpstreamTlsOn(options) ? "on" : "off")
      .Add("shards", r->upstream_->num_shards())
      .Add("block_positions", options.block_positions);
  return r;
}

RelayServer::~RelayServer() { Shutdown(); }

void RelayServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // Answers still due go nowhere once the calls are gone; then no timer
  // fires into the relay, and no call to a shard is left in flight.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  timers_->Stop();
  upstream_->Shutdown();
}

}  // namespace syncnorm
