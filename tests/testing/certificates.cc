#include "tests/testing/certificates.h"

#include <fstream>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

// Runs openssl with `args` in `dir`.
absl::Status OpenSsl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  const std::string log = dir + "/openssl.log";
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(args, log);
  if (!p.ok()) return p.status();
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(30));
  if (code.ok() && *code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(absl::StrJoin(args, " "), "\n", ReadFile(log)));
}

}  // namespace

absl::Status MakeCertificates(const std::string& dir) {
  const std::vector<std::string> ec = {
      "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.begin() + 1, ec.begin(), ec.end());
    return a;
  };
  if (absl::Status s =
          OpenSsl(dir, with({"req", "-x509", "-keyout", dir + "/ca.key", "-out",
                             dir + "/ca.crt", "-days", "2", "-subj",
                             "/CN=syncnorm-test-ca"}));
      !s.ok()) {
    return s;
  }
  // An unrelated CA, which signed nothing here.
  if (absl::Status s =
          OpenSsl(dir, with({"req", "-x509", "-keyout", dir + "/other-ca.key",
                             "-out", dir + "/other-ca.crt", "-days", "2",
                             "-subj", "/CN=some-other-ca"}));
      !s.ok()) {
    return s;
  }
  std::ofstream(dir + "/server.ext")
      << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
         "extendedKeyUsage=serverAuth\n";
  std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  for (const std::string who : {"server", "client"}) {
    if (absl::Status s = OpenSsl(
            dir, with({"req", "-keyout", dir + "/" + who + ".key", "-out",
                       dir + "/" + who + ".csr", "-subj",
                       who == "server" ? "/CN=localhost" : "/CN=trainer"}));
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            OpenSsl(dir, {"x509", "-req", "-in", dir + "/" + who + ".csr",
                          "-CA", dir + "/ca.crt", "-CAkey", dir + "/ca.key",
                          "-CAcreateserial", "-out", dir + "/" + who + ".crt",
                          "-days", "2", "-extfile", dir + "/" + who + ".ext"});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace syncnorm::testing
