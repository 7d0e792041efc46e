// Transport security of the server: TLS credentials from PEM files, and
// the rule that plaintext is only served on loopback unless told otherwise.
#ifndef SYNCNORM_SERVER_RPC_TLS_H_
#define SYNCNORM_SERVER_RPC_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"

namespace syncnorm {

struct TlsFiles {
  std::string cert;       // server certificate chain, PEM
  std::string key;        // its private key, PEM
  std::string client_ca;  // CA of client certificates, PEM; empty: no mTLS
};

// Whether the host part of a listen address ("HOST:PORT", "[V6]:PORT",
// "unix:PATH") can only be reached from this machine: 127.0.0.0/8, ::1,
// localhost, or a Unix socket.
bool IsLoopbackListen(absl::string_view listen);

// OK when the combination is servable: cert and key together (client_ca
// only with them), or no TLS on a loopback address, or allow_insecure.
// INVALID_ARGUMENT naming the flags otherwise.
absl::Status CheckTransportSecurity(absl::string_view listen,
                                    const TlsFiles& tls, bool allow_insecure);

// TLS server credentials from the files (client certificates requested and
// verified against client_ca when set), or insecure ones when no cert is
// given. FAILED_PRECONDITION naming the flag when a file cannot be read or
// is not PEM.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_TLS_H_
