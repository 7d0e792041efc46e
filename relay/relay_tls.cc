#include "relay/relay_tls.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace syncnorm {
namespace {

// The PEM text of `path` (empty for an empty path), or the error naming
// `flag`.
absl::StatusOr<std::string> ReadFlagPem(const char* flag,
                                        const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> pem = ReadPemFile(path);
  if (!pem.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, ": ", pem.status().message()));
  }
  return pem;
}

}  // namespace

bool UpstreamTlsOn(const RelayOptions& o) {
  return o.upstream_tls || !o.upstream_tls_root_ca.empty() ||
         !o.upstream_tls_client_cert.empty() ||
         !o.upstream_tls_client_key.empty();
}

TlsFiles RelayTlsFiles(const RelayOptions& options) {
  return TlsFiles{options.tls_cert, options.tls_key, options.tls_client_ca};
}

absl::Status CheckRelayTls(const RelayOptions& options) {
  if (absl::Status s = CheckTransportSecurity(
          options.listen, RelayTlsFiles(options), options.allow_insecure);
      !s.ok()) {
    return s;
  }
  if (options.upstream_tls_client_cert.empty() !=
      options.upstream_tls_client_key.empty()) {
    return absl::InvalidArgumentError(
        "--upstream_tls_client_cert and --upstream_tls_client_key go "
        "together: give both or neither");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeUpstreamCredentials(const RelayOptions& options) {
  if (!UpstreamTlsOn(options)) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  struct File {
    const char* flag;
    const std::string& path;
    std::string& pem;
  };
  for (const File& f :
       {File{"upstream_tls_root_ca", options.upstream_tls_root_ca,
             ssl.pem_root_certs},
        File{"upstream_tls_client_cert", options.upstream_tls_client_cert,
             ssl.pem_cert_chain},
        File{"upstream_tls_client_key", options.upstream_tls_client_key,
             ssl.pem_private_key}}) {
    absl::StatusOr<std::string> pem = ReadFlagPem(f.flag, f.path);
    if (!pem.ok()) return pem.status();
    f.pem = *std::move(pem);
  }
  return grpc::SslCredentials(ssl);
}

absl::Status CheckRelayTlsFiles(const RelayOptions& options) {
  if (absl::Status s = MakeServerCredentials(RelayTlsFiles(options)).status();
      !s.ok()) {
    return s;
  }
  return MakeUpstreamCredentials(options).status();
}

ConnectFailure ClassifyConnectFailure(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
    return ConnectFailure::kOther;
  }
  const std::string& m = status.error_message();
  // SSL_ERROR_SSL: the protocol itself failed; SSL_ERROR_SYSCALL and the
  // like are a connection that broke during the handshake.
  if ((absl::StrContains(m, "Ssl handshake failed") &&
       absl::StrContains(m, "SSL_ERROR_SSL")) ||
      (absl::StrContains(m, "Peer name") &&
       absl::StrContains(m, "is not in peer certificate"))) {
    return ConnectFailure::kHandshake;
  }
  if (absl::StrContains(m, "failed to connect to all addresses") &&
      absl::StrContains(m, "Socket closed")) {
    return ConnectFailure::kClosed;
  }
  return ConnectFailure::kOther;
}

std::shared_ptr<grpc::ChannelCredentials> TlsProbeCredentials() {
  return grpc::SslCredentials(grpc::SslCredentialsOptions());
}

bool ProbeSawTls(const grpc::Status& probe) {
  if (probe.error_code() != grpc::StatusCode::UNAVAILABLE &&
      probe.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return true;  // an answer over TLS, even a refusal
  }
  const std::string m = absl::AsciiStrToLower(probe.error_message());
  return absl::StrContains(m, "certificate verify failed") ||
         absl::StrContains(m, "certificate_verify_failed") ||
         (absl::StrContains(m, "peer name") &&
          absl::StrContains(m, "is not in peer certificate"));
}

grpc::Status UpstreamTlsMismatch(int shard, const std::string& address,
                                 bool relay_tls, ConnectFailure kind,
                                 const grpc::Status& seen) {
  std::string what;
  if (!relay_tls) {
    what =
        "the relay dials it in plaintext and it serves TLS: give the relay "
        "--upstream_tls and --upstream_tls_root_ca (the CA of the shards' "
        "certificates)";
  } else if (kind == ConnectFailure::kClosed) {
    what =
        "it serves TLS and closed the relay's TLS connection: it likely "
        "requires a client certificate that the relay lacks or that its "
        "--tls_client_ca did not sign; check --upstream_tls_client_cert and "
        "--upstream_tls_client_key";
  } else {
    what =
        "the relay's TLS handshake with it failed: check that it serves TLS "
        "(else drop --upstream_tls), that --upstream_tls_root_ca is the CA "
        "of its certificate, and that the certificate names the address in "
        "--upstream";
  }
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("the relay cannot reach shard ", shard, " (", address,
                   "): TLS mismatch: ", what,
                   " (the relay's --upstream_tls, --upstream_tls_root_ca, "
                   "--upstream_tls_client_cert, --upstream_tls_client_key); "
                   "gRPC said: ",
                   seen.error_message()));
}

}  // namespace syncnorm
