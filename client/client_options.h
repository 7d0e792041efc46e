// Options of the syncnorm client.
#ifndef SYNCNORM_CLIENT_CLIENT_OPTIONS_H_
#define SYNCNORM_CLIENT_CLIENT_OPTIONS_H_

#include <string>

#include "absl/time/time.h"

namespace syncnorm {

struct ClientOptions {
  // The aggregator, "host:port"; or its shards in ordinal order, as
  // "host0:port,host1:port,..." or one name with a "{A..B}" range, e.g. a
  // StatefulSet's pods
  // "syncnorm-aggregator-{0..2}.syncnorm-aggregator.<namespace>.svc:50051"
  // (see client/shard_router.h). Each (job, layer) is held by one shard,
  // chosen from the shard's ordinal, so the list (its length and order)
  // must stay the same for the life of a job; the names behind the
  // ordinals may change. Default: the aggregator's default listen address.
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

  // How long one connection attempt (TCP, TLS and the HTTP/2 handshake) may
  // take before the channel gives up on it and tries again. A server whose
  // kernel accepts the connection but whose process does not answer (a
  // restart, a paused process, a stalled middlebox) holds the calls that
  // wait on it this long; gRPC's own default is 20 s. Set it above the
  // slowest handshake the network may see (TLS over a long round trip, a
  // loaded server): an attempt that needs longer never completes.
  // Default 5 s.
  absl::Duration connect_timeout = absl::Seconds(5);

  // The address of this rank's relay (docs/relay.md), "host:port"; empty:
  // none. Rounds (Reduce streams) go there, every layer's, and the relay
  // routes each to its layer's shard; every other call goes to the shards.
  // Default empty.
  std::string relay;

  // Whether a round the relay cannot take goes to the layer's shard, as a
  // client without a relay sends it (docs/relay.md, "A client's
  // fallback"). The relay cannot take it when its stream broke and no
  // connection to it came up within connect_timeout. The client then sends
  // its rounds to the shards, and returns to the relay at the first step of
  // a later window of 8 steps (8k..8k+7) at which it accepts connections
  // again; in that window a round the relay does not answer within
  // connect_timeout goes to the shard too. It is exact: the shard tells a
  // rank's resend from a conflicting one, also when the relay's merged
  // block carried it. Off: the rounds wait for the relay (or a replacement
  // at its address) until round_timeout. Default true: a relay holds no
  // state, so a dead relay should not stop a job that the shards can
  // serve.
  bool relay_fallback = true;

  // ---- Credentials (see docs/operations.md, "Security") ----
  // TLS: on when `tls` is set or any PEM below is given. tls_root_ca: the
  // CA that signed the server's certificate (PEM text; empty: the system's
  // roots). tls_client_cert / tls_client_key: this client's certificate
  // and key (PEM text), for servers that require mutual TLS.
  // ReadPemFile (client.h) reads them from files.
  bool tls = false;
  std::string tls_root_ca;
  std::string tls_client_cert;
  std::string tls_client_key;
  // Bearer token, sent as `authorization: Bearer <token>` on every call
  // (Reduce streams included). Empty: none.
  std::string token;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_OPTIONS_H_
