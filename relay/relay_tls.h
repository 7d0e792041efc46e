// Transport security of the relay's two hops: the ranks' side served as
// the aggregator serves (server/rpc/tls.h), the shards' side dialed as the
// client dials (client/client.h ReadPemFile).
#ifndef SYNCNORM_RELAY_RELAY_TLS_H_
#define SYNCNORM_RELAY_RELAY_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/status.h"
#include "relay/relay_options.h"
#include "server/rpc/tls.h"

namespace syncnorm {

// Whether the shards are dialed with TLS: upstream_tls, or any upstream
// TLS file given (as ClientOptions' tls).
bool UpstreamTlsOn(const RelayOptions& options);

// The ranks' side's files, as the aggregator takes them.
TlsFiles RelayTlsFiles(const RelayOptions& options);

// OK when both sides' options go together: the aggregator's rule on the
// ranks' side (CheckTransportSecurity: plaintext only on loopback unless
// allow_insecure), and the upstream client certificate and key both or
// neither. INVALID_ARGUMENT naming the flags otherwise.
absl::Status CheckRelayTls(const RelayOptions& options);

// The credentials of every channel to the shards: insecure when upstream
// TLS is off, else TLS with the files' PEM. FAILED_PRECONDITION naming the
// flag when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeUpstreamCredentials(const RelayOptions& options);

// OK when the files of both sides load; the first one's error otherwise.
absl::Status CheckRelayTlsFiles(const RelayOptions& options);

// ---- A TLS mismatch with a shard, told from a shard that is down. ----

// What a failed call to a shard says of the connection gRPC tried:
//   kHandshake: the relay's TLS handshake failed (gRPC 1.51: "Ssl
//     handshake failed: SSL_ERROR_SSL ..."; the shard's certificate not
//     signed by --upstream_tls_root_ca, a plaintext shard answering the
//     relay's hello: "wrong version number") or the shard's certificate
//     does not name it ("Peer name ... is not in peer certificate");
//   kClosed: the shard's side closed the connection before gRPC's own
//     handshake ended ("failed to connect to all addresses ... Socket
//     closed"): a TLS shard dialed in plaintext, a TLS shard that refused
//     the relay's client certificate, or a proxy in front of a shard that
//     is down; a probe tells them apart (ProbeSawTls);
//   kOther: anything else, such as a refused connection (a shard that is
//     down or restarting).
enum class ConnectFailure { kOther, kHandshake, kClosed };
ConnectFailure ClassifyConnectFailure(const grpc::Status& status);

// The credentials of a probe of a shard whose connection closed (kClosed):
// TLS with the system roots and no client certificate.
std::shared_ptr<grpc::ChannelCredentials> TlsProbeCredentials();

// Whether a probe's call, made with TlsProbeCredentials, reached a TLS
// server: its handshake got as far as the server's certificate (checked or
// not), or the call got past it.
bool ProbeSawTls(const grpc::Status& probe);

// What the ranks are answered for a TLS mismatch with shard `shard` at
// `address`, seen as `seen`: FAILED_PRECONDITION (a rank that resent it
// would get the same), naming the shard, what the relay dials it with
// (`relay_tls`), what gRPC said, and the --upstream_tls* flags.
grpc::Status UpstreamTlsMismatch(int shard, const std::string& address,
                                 bool relay_tls, ConnectFailure kind,
                                 const grpc::Status& seen);

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_TLS_H_
