// Options of the relay (docs/relay.md): what main.cc's flags set.
#ifndef SYNCNORM_RELAY_RELAY_OPTIONS_H_
#define SYNCNORM_RELAY_RELAY_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace syncnorm {

struct RelayOptions {
  // HOST:PORT the relay serves its ranks on; port 0 picks a free port
  // (RelayServer::port). Default 127.0.0.1:50061.
  std::string listen = "127.0.0.1:50061";

  // TLS on the ranks' side, as the aggregator's (server/rpc/tls.h): the
  // relay's certificate chain and private key (PEM files), both or
  // neither; with tls_client_ca, ranks must present a certificate signed
  // by that CA (mutual TLS). Default empty: plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Without TLS, a listen address that is not loopback is refused unless
  // this is set. Default false.
  bool allow_insecure = false;

  // The aggregator shards, in ordinal order, as the client's address
  // (client/shard_router.h ParseShardList): each (job, layer) goes to the
  // shard the client's rendezvous hash picks. Required.
  std::string upstream;

  // A parent relay's HOST:PORT (docs/relay.md, Relays of relays): every
  // upstream contribution (a merged block, or one going through) goes to
  // it instead of the shard, over the upstream TLS settings and token
  // below; the job is still read from the shards. Its block_positions must
  // be larger than this relay's for it to merge this relay's blocks.
  // Empty: the shards take them. Default empty.
  std::string parent_relay;

  // B: positions per block, a power of two from 1 to 65,536. The relay
  // merges an aligned block of B positions of a group into one upstream
  // contribution. Default 8 (the capacity model's best fan-in).
  int block_positions = 8;

  // TLS to the shards: on when upstream_tls is set or any file below is
  // given. upstream_tls_root_ca: PEM file of the CA that signed the
  // shards' certificates (empty: the system roots).
  // upstream_tls_client_cert / upstream_tls_client_key: the relay's
  // certificate and key (PEM files) for shards that require mutual TLS,
  // both or neither. Default off.
  bool upstream_tls = false;
  std::string upstream_tls_root_ca;
  std::string upstream_tls_client_cert;
  std::string upstream_tls_client_key;

  // The relay's own bearer token for the shards (a token with the `relay`
  // or `admin` scope takes blocks). Empty: none. Default empty.
  std::string upstream_token;

  // Tokens file of the ranks' tokens, in the aggregator's format
  // (server/rpc/auth.h), reread every second. Empty: no check. Default
  // empty.
  std::string tokens_file;

  // How long an incomplete block waits before the relay rereads the job
  // (GetJob), so that a membership change completes or releases it.
  // Positive. Default 100 ms.
  absl::Duration job_refresh = absl::Milliseconds(100);

  // How much before the job's quorum grace or round timeout (from the
  // block's first arrival) an incomplete block is passed through, for the
  // hop to the shard. At least 0. Default 20 ms.
  absl::Duration pass_through_margin = absl::Milliseconds(20);

  // The most block rounds of one job held at once (waiting for ranks or
  // for the shard's answer); past it a contribution that would open
  // another is refused RESOURCE_EXHAUSTED. Bounds what callers can make
  // the relay hold. Positive. Default 4096.
  int max_pending_blocks_per_job = 4096;

  // The most (job, shard) pairs the relay holds a JobInfo of. Past it the
  // pair idle the longest (no block rounds held) is forgotten, and when
  // every one holds rounds a contribution of another job is refused
  // RESOURCE_EXHAUSTED. Positive. Default 1024.
  int max_jobs = 1024;

  // ---- What the ranks can make the relay hold (docs/relay.md, "What the
  // ranks can make a relay hold"). The aggregator's flags of the same
  // names, with defaults sized for a relay, which serves one block of
  // ranks. Past a limit: RESOURCE_EXHAUSTED naming its flag. Zero or less:
  // no limit. ----

  // Largest contribution (serialized) a rank may send. gRPC's transport
  // takes messages up to twice this (ReceiveCeiling), so that the relay
  // refuses those above it naming the flag. Default 4 MiB: a FORWARD of
  // 65,536 channels with its imported running statistics is 2 MiB.
  int64_t max_message_bytes = int64_t{4} << 20;
  // Open Reduce streams. A stream holds its slot until gRPC is done with
  // it and the relay has answered everything it read (a stream whose
  // client went away keeps its slot while its contributions are held), and
  // reads no more while it holds kHeldMessagesPerStream x
  // max_message_bytes (or 1,024 contributions) not yet answered and
  // written. Default 64: eight per rank of a block of 8.
  int max_streams = 64;
  // ReduceOnce calls in progress, each holding its request and then its
  // answer until the call is over. Default 32 (the syncnorm clients send
  // their rounds on Reduce streams).
  int max_waiting_calls = 32;
  // HTTP/2 streams (calls) one connection may have open at once, as
  // advertised to clients (SETTINGS_MAX_CONCURRENT_STREAMS): gRPC clients
  // queue calls beyond it. Default 100.
  int max_streams_per_connection = 100;
  // A Reduce stream that reads, answers and writes nothing for this long
  // (and holds nothing) ends UNAVAILABLE, freeing its max_streams slot; the
  // clients open a new one when they next send. Default 5 minutes.
  absl::Duration stream_idle_timeout = absl::Minutes(5);
  // What gRPC's transport may hold (a grpc::ResourceQuota): messages still
  // arriving (gRPC takes a whole message before its size check), every
  // stream's unread data, read buffers. Past it gRPC cancels streams, its
  // oldest connections' first, with its own RESOURCE_EXHAUSTED (naming no
  // flag). At least twice max_message_bytes. Default 256 MiB: 32 messages
  // at that ceiling arriving at once.
  int64_t max_transport_bytes = int64_t{256} << 20;
  // Closes a connection that keeps the RPC thread reading inside gRPC
  // while the memory grows past what its messages may hold (an HTTP/2
  // rapid reset), as the aggregator (server/rpc/read_flood.h). It judges
  // by the process's memory, so a relay that shares its process with
  // other work (an in-process relay in a test) turns it off. Default true.
  bool close_read_floods = true;
  // How often the heap trimmer decides whether to give freed heap back to
  // the kernel (server/memory_trimmer.h), as the aggregator's: after a
  // burst, of a wide round's blocks or of a flood, the relay's resident
  // memory comes back down, and the next flood's growth shows to the
  // watchdog above. Zero or less: never. Default 5 s.
  absl::Duration memory_trim_period = absl::Seconds(5);

  // HOST:PORT of the Prometheus endpoint (HTTP GET /metrics), as the
  // aggregator's --metrics_listen; port 0 picks a free one
  // (RelayServer::metrics_port). Empty: no metrics. Default empty.
  std::string metrics_listen;
};

// A Reduce stream reads no more once it holds this many times
// max_message_bytes of contributions not yet answered and answers not yet
// written, until it is below again (the aggregator's stream holds 16; a
// relay's ranks send one round of a layer at a time).
inline constexpr int64_t kHeldMessagesPerStream = 4;
// ... or this many contributions not yet answered, whatever their size.
inline constexpr int kMaxUnansweredPerStream = 1024;

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_OPTIONS_H_
