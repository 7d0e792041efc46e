#include "server/rpc/tls.h"

#include <arpa/inet.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace syncnorm {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view flag,
                                    absl::string_view kind) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  if (in) s << in.rdbuf();
  if (!in || in.bad()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, "='", path, "' cannot be read"));
  }
  std::string pem = s.str();
  if (!absl::StrContains(pem, "-----BEGIN ") || !absl::StrContains(pem, kind)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, "='", path, "' is not a PEM file with a ",
                     kind, " (-----BEGIN ", kind, "-----)"));
  }
  return pem;
}

}  // namespace

bool IsLoopbackListen(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") ||
      absl::StartsWith(listen, "unix-abstract:")) {
    return true;
  }
  absl::string_view host = listen;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(0, close);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != absl::string_view::npos) host = host.substr(0, colon);
  }
  const std::string h = absl::AsciiStrToLower(host);
  if (h == "localhost" || h == "ip6-localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    static const in6_addr kLoopback = IN6ADDR_LOOPBACK_INIT;
    return std::equal(std::begin(v6.s6_addr), std::end(v6.s6_addr),
                      std::begin(kLoopback.s6_addr));
  }
  return false;  // 0.0.0.0, [::], a host name: reachable from elsewhere
}

absl::Status CheckTransportSecurity(absl::string_view listen,
                                    const TlsFiles& tls, bool allow_insecure) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  if (!tls.client_ca.empty() && tls.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca (mutual TLS) needs --tls_cert and --tls_key");
  }
  if (tls.cert.empty() && !allow_insecure && !IsLoopbackListen(listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen='", listen,
        "' can be reached from other machines, and without --tls_cert and "
        "--tls_key it would serve plaintext (tokens included); give them, "
        "listen on loopback (127.0.0.1), or pass --allow_insecure when "
        "something else (a service mesh, a private network) protects the "
        "traffic"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (tls.cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert =
      ReadPem(tls.cert, "tls_cert", "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key, "tls_key", "PRIVATE KEY");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      tls.client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPem(tls.client_ca, "tls_client_ca", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace syncnorm
