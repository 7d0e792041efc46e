#include "server/server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/kv_state_store.h"
#include "server/memory_engine.h"
#include "server/rocksdb_engine.h"

namespace syncnorm {
namespace {

AggregatorOptions ToAggregatorOptions(const ServerOptions& options) {
  AggregatorOptions out;
  out.default_round_timeout = options.round_timeout;
  out.reaper_period = options.reaper_period;
  out.keep_checkpoints = options.keep_checkpoints;
  return out;
}

absl::StatusOr<std::unique_ptr<StateStore>> OpenStore(
    const ServerOptions& options) {
  if (options.data_dir.empty()) {
    return std::unique_ptr<StateStore>(
        std::make_unique<KvStateStore>(std::make_unique<MemoryEngine>()));
  }
  absl::StatusOr<std::unique_ptr<RocksDbEngine>> engine =
      RocksDbEngine::Open(options.data_dir, options.sync_writes);
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<StateStore>(
      std::make_unique<KvStateStore>(*std::move(engine)));
}

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)), clock_(std::make_unique<RealClock>()) {}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

absl::Status Server::Start() {
  if (options_.round_timeout <= absl::ZeroDuration() ||
      options_.reaper_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "round_timeout and reaper_period must be positive");
  }
  if (options_.keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        "keep_checkpoints must be >= 0 (0 keeps all)");
  }
  absl::MutexLock lock(&mu_);
  if (store_ != nullptr || shut_down_) {
    return absl::FailedPreconditionError("the server was already started");
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenStore(options_);
  if (!store.ok()) return store.status();
  auto aggregator = std::make_unique<Aggregator>(
      ToAggregatorOptions(options_), clock_.get(), store->get());
  if (absl::Status s = aggregator->Load(); !s.ok()) return s;
  store_ = *std::move(store);
  aggregator_ = std::move(aggregator);
  service_ = std::make_unique<AggregatorService>(aggregator_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service_.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options_.listen,
        "'; check that it is HOST:PORT and that the port is free"));
  }
  if (grpc::HealthCheckServiceInterface* health =
          server->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }
  aggregator_->StartReaper();
  server_ = std::move(server);
  bound_port_ = port;
  return absl::OkStatus();
}

int Server::bound_port() const {
  absl::MutexLock lock(&mu_);
  return bound_port_;
}

void Server::Shutdown(absl::Duration grace) {
  grpc::Server* server = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (server_ == nullptr || shut_down_) return;
    shut_down_ = true;
    server = server_.get();
  }
  if (grpc::HealthCheckServiceInterface* health =
          server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
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
