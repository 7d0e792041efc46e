#include "relay/relay_tls.h"

#include <string>

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

}  // namespace syncnorm
