// RelayFallback's routes: a rank that lost its relay stays on the shards
// until a new window of steps finds the relay's channel READY, spends that
// window on probation, and is on the relay from the next one.
#include "client/relay_fallback.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client_options.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {
namespace {

using Route = RelayFallback::Route;

std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// A fallback for rank 0 of job "j" whose relay is behind `relay`; its one
// shard is never reached here.
std::unique_ptr<RelayFallback> FallbackTo(
    std::shared_ptr<grpc::Channel> relay) {
  return std::make_unique<RelayFallback>(
      std::move(relay),
      std::vector<std::shared_ptr<grpc::Channel>>{ChannelTo("127.0.0.1:1")},
      "j", 0, ClientOptions());
}

TEST(RelayFallbackTest, AnUnreachableRelayKeepsTheRankOnTheShards) {
  // Nothing listens on port 1.
  std::unique_ptr<RelayFallback> fallback =
      FallbackTo(ChannelTo("127.0.0.1:1"));
  EXPECT_EQ(fallback->RouteOf(3), Route::kRelay);
  fallback->RelayUnreachable(3);
  for (int64_t step : {3, 4, 7, 8, 15, 16, 40}) {
    EXPECT_EQ(fallback->RouteOf(step), Route::kShards) << "step " << step;
  }
}

TEST(RelayFallbackTest, AReachableRelayTakesTheRankBackAtTheNextWindow) {
  v1::Aggregator::Service service;  // any server makes the channel READY
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  std::shared_ptr<grpc::Channel> relay =
      ChannelTo(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(relay->WaitForConnected(std::chrono::system_clock::now() +
                                      std::chrono::seconds(10)));
  std::unique_ptr<RelayFallback> fallback = FallbackTo(relay);

  fallback->RelayUnreachable(3);
  // The rest of the window [0, 8) stays on the shards: the block's other
  // ranks, which fell back with this one, are there.
  EXPECT_EQ(fallback->RouteOf(5), Route::kShards);
  EXPECT_EQ(fallback->RouteOf(7), Route::kShards);
  // The next window is on probation, the one after on the relay.
  EXPECT_EQ(fallback->RouteOf(8), Route::kProbation);
  EXPECT_EQ(fallback->RouteOf(15), Route::kProbation);
  EXPECT_EQ(fallback->RouteOf(16), Route::kRelay);
  EXPECT_EQ(fallback->RouteOf(40), Route::kRelay);

  // Unanswered on probation: back on the shards for the rest of its window.
  fallback->RelayUnreachable(41);
  EXPECT_EQ(fallback->RouteOf(41), Route::kShards);
  EXPECT_EQ(fallback->RouteOf(47), Route::kShards);
  EXPECT_EQ(fallback->RouteOf(48), Route::kProbation);
  EXPECT_EQ(fallback->RouteOf(56), Route::kRelay);
  server->Shutdown();
}

}  // namespace
}  // namespace syncnorm
