// LocalAggregator: a syncnorm aggregator inside a test's own process, for the
// tests of code that uses syncnorm (@syncnorm//testing:local_aggregator; see
// docs/bazel.md, "Using syncnorm from your Bazel workspace").
//
//   absl::StatusOr<std::unique_ptr<syncnorm::testing::LocalAggregator>>
//       aggregator = syncnorm::testing::LocalAggregator::Start();
//   ASSERT_TRUE(aggregator.ok()) << aggregator.status();
//   syncnorm::ClientOptions options;
//   options.address = (*aggregator)->address();
#ifndef SYNCNORM_TESTING_LOCAL_AGGREGATOR_H_
#define SYNCNORM_TESTING_LOCAL_AGGREGATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace syncnorm {

class Server;

namespace testing {

struct LocalAggregatorOptions {
  // Folder of the state store (RocksDB; created with its parents if
  // missing). It outlives the aggregator: another one started on the same
  // folder serves the same jobs, statistics and checkpoints. Empty keeps
  // the state in memory, gone when the aggregator is. Default empty.
  std::string data_dir;
  // How long a round waits for missing ranks when its job sets no
  // round_timeout_ms; then it fails DEADLINE_EXCEEDED naming them. Must be
  // positive. Default 30 s.
  absl::Duration round_timeout = absl::Seconds(30);
};

// An aggregator serving plaintext gRPC on a free port of 127.0.0.1, with no
// authentication, the server's default limits, and the full service
// (syncnorm.v1.Aggregator, grpc.health.v1.Health, reflection). Destroying it
// stops it at once: rounds still waiting fail UNAVAILABLE, the state store
// is closed, and the port is released. Thread-safe.
class LocalAggregator {
 public:
  // Serving when it returns. INVALID_ARGUMENT for bad options; the state
  // store's error when data_dir cannot be created or opened (say, another
  // aggregator holds it); UNAVAILABLE when no port can be bound.
  static absl::StatusOr<std::unique_ptr<LocalAggregator>> Start(
      LocalAggregatorOptions options = {});

  ~LocalAggregator();
  LocalAggregator(const LocalAggregator&) = delete;
  LocalAggregator& operator=(const LocalAggregator&) = delete;

  // "127.0.0.1:<port>", for syncnorm::ClientOptions::address or a gRPC
  // channel.
  std::string address() const;

 private:
  LocalAggregator(std::unique_ptr<Server> server, int port);

  // Constant after construction.
  const std::unique_ptr<Server> server_;
  const int port_;
};

}  // namespace testing
}  // namespace syncnorm

#endif  // SYNCNORM_TESTING_LOCAL_AGGREGATOR_H_
