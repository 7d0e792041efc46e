#include "server/rpc/tls.h"

#include <string>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(TlsTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:50051", "127.3.2.1:0", "localhost:1",
                        "LOCALHOST:1", "[::1]:50051", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:1",
                        "example.com:1", "128.0.0.1:1", "[::2]:1"}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
  }
}

TEST(TlsTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  EXPECT_TRUE(CheckTransportSecurity("127.0.0.1:1", {}, false).ok());
  absl::Status s = CheckTransportSecurity("0.0.0.0:1", {}, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--allow_insecure"), std::string::npos) << s;
  EXPECT_TRUE(CheckTransportSecurity("0.0.0.0:1", {}, true).ok());
  EXPECT_TRUE(
      CheckTransportSecurity("0.0.0.0:1", {"c.pem", "k.pem", ""}, false).ok());
}

TEST(TlsTest, FlagsGoTogether) {
  EXPECT_FALSE(
      CheckTransportSecurity("127.0.0.1:1", {"c", "", ""}, false).ok());
  EXPECT_FALSE(
      CheckTransportSecurity("127.0.0.1:1", {"", "k", ""}, false).ok());
  EXPECT_FALSE(
      CheckTransportSecurity("127.0.0.1:1", {"", "", "ca"}, false).ok());
}

TEST(TlsTest, UnreadableFilesNameTheFlag) {
  auto creds = MakeServerCredentials({"/no/such/cert", "/no/such/key", ""});
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("--tls_cert='/no/such/cert'"),
            std::string::npos)
      << creds.status();
  EXPECT_TRUE(MakeServerCredentials({}).ok());  // insecure
}

}  // namespace
}  // namespace syncnorm
