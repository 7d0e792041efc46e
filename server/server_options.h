// Everything the aggregator server can be told at start.
#ifndef SYNCNORM_SERVER_SERVER_OPTIONS_H_
#define SYNCNORM_SERVER_SERVER_OPTIONS_H_

#include <string>

#include "absl/time/time.h"

namespace syncnorm {

struct ServerOptions {
  // HOST:PORT to listen on (insecure). Port 0 picks a free port; see
  // Server::bound_port(). Default "127.0.0.1:50051".
  std::string listen = "127.0.0.1:50051";
  // How long a round waits for missing ranks when its job sets no
  // round_timeout_ms. Must be positive. Default 30 s.
  absl::Duration round_timeout = absl::Seconds(30);
  // Folder of the state store. Accepted, not used yet (the store is not
  // built). Default "./syncnorm-data".
  std::string data_dir = "./syncnorm-data";
  // How often overdue rounds are failed. Default 20 ms.
  absl::Duration reaper_period = absl::Milliseconds(20);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_SERVER_OPTIONS_H_
