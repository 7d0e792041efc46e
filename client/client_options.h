// Options of the syncnorm client.
#ifndef SYNCNORM_CLIENT_CLIENT_OPTIONS_H_
#define SYNCNORM_CLIENT_CLIENT_OPTIONS_H_

#include <string>

#include "absl/time/time.h"

namespace syncnorm {

struct ClientOptions {
  // The aggregator, "host:port". Default: the aggregator's default listen
  // address.
  std::string address = "127.0.0.1:50051";

  // Deadline of each unary call (CreateJob, GetJob, ...). Calls wait for the
  // server to become reachable within it. Default 30 s.
  absl::Duration rpc_timeout = absl::Seconds(30);

  // How long one round (a forward or backward sync) may take end to end,
  // including reconnects and resends. Set it above the job's
  // round_timeout_ms so that the server's DEADLINE_EXCEEDED, which names the
  // missing ranks, arrives first. Default 60 s.
  absl::Duration round_timeout = absl::Seconds(60);

  // Backoff between reconnect attempts of a broken Reduce stream: starts at
  // the initial value and doubles up to the maximum. Defaults 20 ms / 1 s.
  absl::Duration reconnect_backoff_initial = absl::Milliseconds(20);
  absl::Duration reconnect_backoff_max = absl::Seconds(1);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_OPTIONS_H_
