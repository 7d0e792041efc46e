// Test certificates made with the openssl CLI, for TLS and mutual TLS.
#ifndef SYNCNORM_TESTS_TESTING_CERTIFICATES_H_
#define SYNCNORM_TESTS_TESTING_CERTIFICATES_H_

#include <string>

#include "absl/status/status.h"

namespace syncnorm::testing {

// Writes under `dir`, each key P-256, valid two days: ca.crt/ca.key (the
// test CA), server.crt/server.key (signed by it, for localhost and
// 127.0.0.1, serverAuth), client.crt/client.key (signed by it, CN=trainer,
// clientAuth) and other-ca.crt/other-ca.key (a CA that signed nothing).
// INTERNAL with openssl's output when a command fails.
absl::Status MakeCertificates(const std::string& dir);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_CERTIFICATES_H_
