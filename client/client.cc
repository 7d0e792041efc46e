// Client: its channels and contributors. The calls, which fan out over the
// shards, are in client_calls.cc.
#include "client/client.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/channel_args.h"
#include "client/relay_fallback.h"
#include "client/shard_router.h"
#include "client/sharded_node_group.h"
#include "client/solo_node_group.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace syncnorm {
namespace {

// Adds `authorization: Bearer <token>` to every call of the channel.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

std::shared_ptr<grpc::ChannelCredentials> MakeCredentials(
    const ClientOptions& options) {
  if (!options.tls && options.tls_root_ca.empty() &&
      options.tls_client_cert.empty() && options.tls_client_key.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls_root_ca;
  ssl.pem_cert_chain = options.tls_client_cert;
  ssl.pem_private_key = options.tls_client_key;
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options) {
  // Keepalive, quick reconnects, a wide layer's messages (channel_args.h).
  grpc::ChannelArguments args = RoundChannelArguments();
  // gRPC's name for the connect timeout: an attempt gets the larger of it
  // and the current backoff.
  args.SetInt(
      GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.connect_timeout)));
  if (options.token.empty()) {
    return grpc::CreateCustomChannel(options.address, MakeCredentials(options),
                                     args);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  // gRPC keeps the factory as long as the channel.
  interceptors.push_back(
      std::make_unique<BearerInterceptorFactory>(options.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.address, MakeCredentials(options), args, std::move(interceptors));
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  if (in) s << in.rdbuf();
  if (!in || in.bad()) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  }
  return s.str();
}

Client::Client(const ClientOptions& options) : options_(options) {
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseShardList(options_.address);
  if (!addresses.ok()) {
    address_status_ = addresses.status();
    addresses = std::vector<std::string>{options_.address};
  }
  for (std::string& address : *addresses) {
    ClientOptions one = options_;
    one.address = address;
    std::shared_ptr<grpc::Channel> channel = MakeChannel(one);
    auto stub = v1::Aggregator::NewStub(channel);
    shards_.push_back(
        Shard{std::move(address), std::move(channel), std::move(stub)});
  }
  if (!options_.relay.empty()) {
    ClientOptions relay = options_;
    relay.address = options_.relay;
    relay_channel_ = MakeChannel(relay);
  }
}

std::vector<std::string> Client::shards() const {
  std::vector<std::string> out;
  for (const Shard& s : shards_) out.push_back(s.address);
  return out;
}

int Client::ShardOf(const std::string& job_id, int layer) const {
  return syncnorm::ShardOf(job_id, layer, static_cast<int>(shards_.size()));
}

std::unique_ptr<Contributor> Client::NewContributor(const std::string& job_id,
                                                    int rank) const {
  if (relay_channel_ == nullptr) {
    return std::make_unique<Contributor>(shards_[0].channel, job_id, rank,
                                         options_);
  }
  // A relay takes every layer's rounds and routes them itself; without it
  // they go to each layer's shard.
  std::unique_ptr<RelayFallback> fallback;
  if (options_.relay_fallback) {
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (const Shard& s : shards_) channels.push_back(s.channel);
    fallback = std::make_unique<RelayFallback>(
        relay_channel_, std::move(channels), job_id, rank, options_);
  }
  return std::make_unique<Contributor>(relay_channel_, job_id, rank, options_,
                                       /*clock=*/nullptr, std::move(fallback));
}

std::unique_ptr<NodeGroup> Client::NewNodeGroup(const std::string& job_id,
                                                int rank) const {
  if (shards_.size() == 1 || relay_channel_ != nullptr) {
    return std::make_unique<SoloNodeGroup>(NewContributor(job_id, rank));
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const Shard& s : shards_) channels.push_back(s.channel);
  return std::make_unique<ShardedNodeGroup>(std::move(channels), job_id, rank,
                                            options_);
}

}  // namespace syncnorm
