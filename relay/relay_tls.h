// Transport security of the relay's two hops: the ranks' side served as
// the aggregator serves (server/rpc/tls.h), the shards' side dialed as the
// client dials (client/client.h ReadPemFile).
#ifndef SYNCNORM_RELAY_RELAY_TLS_H_
#define SYNCNORM_RELAY_RELAY_TLS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
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

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_TLS_H_
