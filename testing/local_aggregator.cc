#include "testing/local_aggregator.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/server.h"
#include "server/server_options.h"

namespace syncnorm {
namespace testing {

absl::StatusOr<std::unique_ptr<LocalAggregator>> LocalAggregator::Start(
    LocalAggregatorOptions options) {
  if (options.round_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalAggregatorOptions::round_timeout must be "
                     "positive, not ",
                     absl::FormatDuration(options.round_timeout)));
  }
  ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.data_dir = std::move(options.data_dir);
  server_options.round_timeout = options.round_timeout;
  // The test's process is not the aggregator's: leave its heap alone.
  server_options.memory_trim_period = absl::ZeroDuration();
  // Its memory grows by the test's own work too, which the read-flood
  // watchdog would take for a flood of the test's connection.
  server_options.close_read_floods = false;
  auto server = std::make_unique<Server>(std::move(server_options));
  if (absl::Status started = server->Start(); !started.ok()) return started;
  const int port = server->bound_port();
  return std::unique_ptr<LocalAggregator>(
      new LocalAggregator(std::move(server), port));
}

LocalAggregator::LocalAggregator(std::unique_ptr<Server> server, int port)
    : server_(std::move(server)), port_(port) {}

LocalAggregator::~LocalAggregator() {
  server_->Shutdown(absl::ZeroDuration());
  server_->Wait();
}

std::string LocalAggregator::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

}  // namespace testing
}  // namespace syncnorm
