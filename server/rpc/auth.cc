#include "server/rpc/auth.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/domain/bounded_text.h"
#include "server/domain/log.h"

namespace syncnorm {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 4096;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tokens_file='", path, "' cannot be read"));
  }
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tokens_file='", path, "' cannot be read"));
  }
  return s.str();
}

bool ValidTokenChar(char c) { return c > ' ' && c < 127 && c != ','; }

// Whether `text` reads as a scope list: what a line whose columns are
// swapped has first.
bool IsScopeList(absl::string_view text) {
  for (absl::string_view scope : absl::StrSplit(text, ',')) {
    if (scope != "admin" && scope != "relay" &&
        !(absl::ConsumePrefix(&scope, "job:") && !scope.empty())) {
      return false;
    }
  }
  return true;
}

std::string Scopes(const TokenGrant& g) {
  std::vector<std::string> scopes;
  if (g.admin) scopes.push_back("admin");
  if (g.relay) scopes.push_back("relay");
  for (const std::string& job : g.jobs) scopes.push_back("job:" + job);
  return absl::StrJoin(scopes, ",");
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::vector<TokenGrant>> ParseTokens(absl::string_view text) {
  std::vector<TokenGrant> grants;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const auto bad = [line_number](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens file, line ", line_number, ": ", what,
          "; expected '<token> <scope>[,<scope>...]' with scopes 'admin', "
          "'relay' or 'job:<job_id>'"));
    };
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return bad(fields.size() < 2 ? "no scope after the token"
                                   : "more than a token and a scope list "
                                     "(no spaces between scopes)");
    }
    TokenGrant grant;
    grant.token = std::string(fields[0]);
    if (grant.token.size() < kMinTokenLength ||
        grant.token.size() > kMaxTokenLength) {
      return bad(absl::StrCat("the token has ", grant.token.size(),
                              " characters, not ", kMinTokenLength, " to ",
                              kMaxTokenLength));
    }
    if (!std::all_of(grant.token.begin(), grant.token.end(), ValidTokenChar)) {
      return bad(
          "the token has a character other than printable ASCII "
          "(spaces and commas excluded)");
    }
    std::set<std::string> jobs;
    int index = 0;
    for (absl::string_view scope : absl::StrSplit(fields[1], ',')) {
      ++index;
      if (scope == "admin") {
        grant.admin = true;
      } else if (scope == "relay") {
        grant.relay = true;
      } else if (absl::ConsumePrefix(&scope, "job:") && !scope.empty()) {
        jobs.insert(std::string(scope));
      } else {
        // Never quoted: a line can be anything, a token in the wrong
        // column included (what an error says reaches the log).
        return bad(absl::StrCat(
            "scope ", index,
            " of the second column is none of 'admin', 'relay' and "
            "'job:<job_id>'",
            IsScopeList(fields[0])
                ? "; the first column reads as scopes: are the columns "
                  "swapped? The token comes first"
                : ""));
      }
    }
    grant.jobs.assign(jobs.begin(), jobs.end());
    for (const TokenGrant& other : grants) {
      if (ConstantTimeEquals(other.token, grant.token)) {
        return bad("the token appears on an earlier line too");
      }
    }
    grants.push_back(std::move(grant));
  }
  return grants;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Open(
    std::string path, absl::Duration poll_period) {
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) return content.status();
  absl::StatusOr<std::vector<TokenGrant>> grants = ParseTokens(*content);
  if (!grants.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file='", path, "': ", grants.status().message()));
  }
  auto auth = std::unique_ptr<Authenticator>(
      new Authenticator(std::move(path), *std::move(content),
                        std::make_shared<const Grants>(*std::move(grants))));
  if (poll_period > absl::ZeroDuration()) {
    Authenticator* self = auth.get();
    auth->poller_ = std::make_unique<PeriodicThread>(
        poll_period, [self, last_error = std::string()]() mutable {
          self->Poll(last_error);
        });
  }
  return auth;
}

Authenticator::Authenticator(std::vector<TokenGrant> grants)
    : grants_(std::make_shared<const Grants>(std::move(grants))) {}

Authenticator::Authenticator(std::string path, std::string content,
                             std::shared_ptr<const Grants> grants)
    : path_(std::move(path)),
      grants_(std::move(grants)),
      content_(std::move(content)) {}

Authenticator::~Authenticator() = default;

void Authenticator::Poll(std::string& last_error) {
  absl::Status s = Reload();
  if (!s.ok() && s.ToString() != last_error) {
    LogLine("tokens_reload_failed", LogLevel::kError)
        .Add("file", path_)
        .Add("tokens_kept", size())
        .Add("error", s.ToString());
  }
  last_error = s.ok() ? "" : s.ToString();
}

absl::Status Authenticator::Reload() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> content = ReadFile(path_);
  if (!content.ok()) return content.status();
  {
    absl::MutexLock lock(&mu_);
    if (*content == content_) return absl::OkStatus();
  }
  absl::StatusOr<std::vector<TokenGrant>> grants = ParseTokens(*content);
  if (!grants.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file='", path_, "': ", grants.status().message()));
  }
  const size_t count = grants->size();
  {
    absl::MutexLock lock(&mu_);
    grants_ = std::make_shared<const Grants>(*std::move(grants));
    content_ = *std::move(content);
  }
  LogLine("tokens_reloaded").Add("file", path_).Add("tokens", count);
  return absl::OkStatus();
}

int Authenticator::size() const { return static_cast<int>(Current()->size()); }

std::shared_ptr<const Authenticator::Grants> Authenticator::Current() const {
  absl::MutexLock lock(&mu_);
  return grants_;
}

absl::StatusOr<const TokenGrant*> Authenticator::Find(
    absl::string_view header, const Grants& grants) const {
  absl::string_view token = absl::StripAsciiWhitespace(header);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send the metadata "
        "'authorization: Bearer <token>' (the clients' `token` option)");
  }
  if (token.size() < 7 ||
      !absl::EqualsIgnoreCase(token.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError(
        "the authorization metadata is not 'Bearer <token>'");
  }
  token = absl::StripLeadingAsciiWhitespace(token.substr(7));
  // Every token is compared, whatever matches, so that the time taken says
  // nothing about which one did.
  const TokenGrant* found = nullptr;
  for (const TokenGrant& g : grants) {
    if (ConstantTimeEquals(g.token, token)) found = &g;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        "the bearer token is not valid on this server (unknown or revoked)");
  }
  return found;
}

absl::Status Authenticator::Authenticate(absl::string_view header) const {
  std::shared_ptr<const Grants> grants = Current();
  return Find(header, *grants).status();
}

absl::Status Authenticator::AuthorizeJob(absl::string_view header,
                                         absl::string_view job_id) const {
  std::shared_ptr<const Grants> grants = Current();
  absl::StatusOr<const TokenGrant*> grant = Find(header, *grants);
  if (!grant.ok()) return grant.status();
  const TokenGrant& g = **grant;
  if (g.admin || std::binary_search(g.jobs.begin(), g.jobs.end(), job_id)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("the bearer token does not grant job '", BoundedText(job_id),
                   "' (its scopes: ", Scopes(g), ")"));
}

absl::Status Authenticator::AuthorizeRelay(absl::string_view header,
                                           absl::string_view job_id) const {
  if (absl::Status s = AuthorizeJob(header, job_id); !s.ok()) return s;
  std::shared_ptr<const Grants> grants = Current();
  absl::StatusOr<const TokenGrant*> grant = Find(header, *grants);
  if (!grant.ok()) return grant.status();
  if ((*grant)->admin || (*grant)->relay) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "a relay block (Contribution.relay) vouches for other ranks' "
      "contributions and needs a token with the 'relay' or 'admin' scope "
      "(the bearer token's scopes: ",
      Scopes(**grant), ")"));
}

absl::Status Authenticator::AuthorizeAdmin(absl::string_view header) const {
  std::shared_ptr<const Grants> grants = Current();
  absl::StatusOr<const TokenGrant*> grant = Find(header, *grants);
  if (!grant.ok()) return grant.status();
  if ((*grant)->admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("this call needs a token with the 'admin' scope (the "
                   "bearer token's scopes: ",
                   Scopes(**grant), ")"));
}

}  // namespace syncnorm
