#include "server/rpc/auth.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kJobA[] = "job-a-token-0123456789";

std::string Bearer(const std::string& token) { return "Bearer " + token; }

TEST(ParseTokensTest, ReadsScopesCommentsAndBlankLines) {
  auto grants = ParseTokens(absl::StrCat(
      "# the admins\n\n", kAdmin, " admin\n  ", kJobA, "\tjob:a,job:b  \n"));
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(grants->size(), 2u);
  EXPECT_TRUE((*grants)[0].admin);
  EXPECT_FALSE((*grants)[1].admin);
  EXPECT_EQ((*grants)[1].jobs, (std::vector<std::string>{"a", "b"}));
}

TEST(ParseTokensTest, ErrorsNameTheLineNeverTheToken) {
  const std::string secret = "very-secret-token-value";
  for (const std::string& text :
       {absl::StrCat("# x\n", secret, "\n"),
        absl::StrCat("# x\n", secret, " job:\n"),
        absl::StrCat("# x\n", secret, " root\n"),
        absl::StrCat("# x\n", secret, " admin job:a\n"),
        absl::StrCat("# x\n", "short admin\n"),
        absl::StrCat(secret, " admin\n", secret, " job:a\n"),
        // The columns swapped, scope lists long enough to pass as tokens.
        absl::StrCat("# x\n", "job:resnet50-run7 ", secret, "\n"),
        absl::StrCat("# x\n", "admin,job:resnet50 ", secret, "\n"),
        absl::StrCat("# x\n", "job:resnet50-run7 job:a,", secret, "\n"),
        absl::StrCat("# x\n", "job:resnet50-run7 ", secret, " admin\n"),
        absl::StrCat("# x\n", secret, "\xc3 admin\n")}) {
    auto grants = ParseTokens(text);
    ASSERT_FALSE(grants.ok()) << text;
    EXPECT_EQ(grants.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(grants.status().message().find("line 2"), std::string::npos)
        << grants.status();
    EXPECT_EQ(grants.status().message().find(secret), std::string::npos)
        << grants.status();
  }
}

// The reported case: `job:<id> <token>` on line 7. The error says the
// columns look swapped, and shows no part of the line.
TEST(ParseTokensTest, SwappedColumnsAreNamedNotQuoted) {
  const std::string secret =
      "3f9c1b7e5d2a4c6e8f0a1b3c5d7e9f1a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e";
  std::string text = absl::StrCat(kAdmin, " admin\n");
  for (int i = 2; i < 7; ++i) text += "# comment\n";
  text += absl::StrCat("job:resnet50-run7 ", secret, "\n");
  auto grants = ParseTokens(text);
  ASSERT_FALSE(grants.ok());
  const std::string message(grants.status().message());
  EXPECT_NE(message.find("line 7: scope 1 of the second column"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("are the columns swapped?"), std::string::npos)
      << message;
  for (size_t i = 0; i + 8 <= secret.size(); ++i) {
    ASSERT_EQ(message.find(secret.substr(i, 8)), std::string::npos)
        << "a piece of the token is in the message: " << message;
  }
  EXPECT_EQ(message.find("resnet50"), std::string::npos)
      << "nothing of the line is quoted: " << message;
}

TEST(ConstantTimeEqualsTest, Compares) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(AuthenticatorTest, ScopesDecide) {
  auto grants =
      ParseTokens(absl::StrCat(kAdmin, " admin\n", kJobA, " job:a\n"));
  ASSERT_TRUE(grants.ok());
  Authenticator auth(*grants);
  EXPECT_TRUE(auth.AuthorizeJob(Bearer(kAdmin), "anything").ok());
  EXPECT_TRUE(auth.AuthorizeAdmin(Bearer(kAdmin)).ok());
  EXPECT_TRUE(auth.AuthorizeJob(Bearer(kJobA), "a").ok());
  EXPECT_TRUE(auth.AuthorizeJob(absl::StrCat("bearer  ", kJobA), "a").ok());

  absl::Status s = auth.AuthorizeJob(Bearer(kJobA), "b");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("job 'b'"), std::string::npos) << s;
  EXPECT_EQ(s.message().find(kJobA), std::string::npos) << s;
  s = auth.AuthorizeAdmin(Bearer(kJobA));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;

  EXPECT_EQ(auth.AuthorizeJob("", "a").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.AuthorizeJob(kJobA, "a").code(),  // no "Bearer "
            absl::StatusCode::kUnauthenticated);
  s = auth.AuthorizeJob(Bearer("unknown-token-0123456789"), "a");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(s.message().find("unknown-token"), std::string::npos) << s;
  // A prefix of a valid token is not it.
  EXPECT_EQ(
      auth.AuthorizeJob(Bearer(std::string(kJobA).substr(0, 20)), "a").code(),
      absl::StatusCode::kUnauthenticated);
}

// A relay block vouches for other ranks' fingerprints: a trainer's job
// token may not send one, a relay's token (relay and the job) may.
TEST(AuthenticatorTest, RelayBlocksNeedTheRelayScopeAndTheJob) {
  constexpr char kRelay[] = "relay-token-0123456789";
  constexpr char kRelayOnly[] = "relay-only-token-0123456789";
  auto grants =
      ParseTokens(absl::StrCat(kAdmin, " admin\n", kJobA, " job:a\n", kRelay,
                               " relay,job:a\n", kRelayOnly, " relay\n"));
  ASSERT_TRUE(grants.ok()) << grants.status();
  EXPECT_TRUE((*grants)[2].relay);
  EXPECT_FALSE((*grants)[1].relay);
  Authenticator auth(*grants);
  EXPECT_TRUE(auth.AuthorizeRelay(Bearer(kRelay), "a").ok());
  EXPECT_TRUE(auth.AuthorizeRelay(Bearer(kAdmin), "a").ok());
  // The relay's token is no more than a job token elsewhere.
  EXPECT_TRUE(auth.AuthorizeJob(Bearer(kRelay), "a").ok());
  EXPECT_EQ(auth.AuthorizeAdmin(Bearer(kRelay)).code(),
            absl::StatusCode::kPermissionDenied);
  absl::Status s = auth.AuthorizeRelay(Bearer(kJobA), "a");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("'relay' or 'admin' scope"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("job:a"), std::string::npos) << s;
  s = auth.AuthorizeRelay(Bearer(kRelayOnly), "a");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("job 'a'"), std::string::npos) << s;
  EXPECT_EQ(auth.AuthorizeRelay("", "a").code(),
            absl::StatusCode::kUnauthenticated);
}

// Authentication alone: any token in force, whatever its scopes.
TEST(AuthenticatorTest, AuthenticateTakesAnyTokenInForce) {
  auto grants =
      ParseTokens(absl::StrCat(kAdmin, " admin\n", kJobA, " job:a\n"));
  ASSERT_TRUE(grants.ok());
  Authenticator auth(*grants);
  EXPECT_TRUE(auth.Authenticate(Bearer(kAdmin)).ok());
  EXPECT_TRUE(auth.Authenticate(Bearer(kJobA)).ok());
  for (const std::string& header : {std::string(""), std::string(kJobA),
                                    Bearer("unknown-token-0123456789")}) {
    const absl::Status s = auth.Authenticate(header);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << header;
    EXPECT_EQ(s.message().find("unknown-token"), std::string::npos) << s;
  }
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void Write(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

TEST(AuthenticatorTest, OpenFailsClearlyOnAMissingOrBadFile) {
  auto missing = Authenticator::Open(TempPath("no-such-tokens"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--tokens_file="),
            std::string::npos);
  const std::string path = TempPath("bad-tokens");
  Write(path, "x-secret-token-123456 nope\n");
  auto bad = Authenticator::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos);
  EXPECT_EQ(bad.status().message().find("x-secret"), std::string::npos);
}

TEST(AuthenticatorTest, ReloadsAndKeepsTheOldTokensOnABadFile) {
  const std::string path = TempPath("tokens");
  Write(path, absl::StrCat(kAdmin, " admin\n"));
  auto auth = Authenticator::Open(path, absl::Milliseconds(20));
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->AuthorizeJob(Bearer(kJobA), "a").code(),
            absl::StatusCode::kUnauthenticated);

  auto await = [&](absl::StatusCode want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while ((*auth)->AuthorizeJob(Bearer(kJobA), "a").code() != want &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return (*auth)->AuthorizeJob(Bearer(kJobA), "a").code();
  };
  Write(path, absl::StrCat(kAdmin, " admin\n", kJobA, " job:a\n"));
  EXPECT_EQ(await(absl::StatusCode::kOk), absl::StatusCode::kOk);

  // A broken file: the previous tokens stay.
  Write(path, "garbage\n");
  EXPECT_FALSE((*auth)->Reload().ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE((*auth)->AuthorizeJob(Bearer(kJobA), "a").ok());
  EXPECT_EQ((*auth)->size(), 2);

  // Revoked.
  Write(path, absl::StrCat(kAdmin, " admin\n"));
  EXPECT_EQ(await(absl::StatusCode::kUnauthenticated),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*auth)->AuthorizeAdmin(Bearer(kAdmin)).ok());
}

}  // namespace
}  // namespace syncnorm
